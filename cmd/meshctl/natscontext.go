package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// natsContext is the part of a `nats` CLI context file that meshctl uses:
// <config>/nats/context/<name>.json, where <config> is $XDG_CONFIG_HOME or
// ~/.config, with the selected context's name in <config>/nats/context.txt
// (the layout and field names of the nats CLI's natscontext package).
type natsContext struct {
	Name        string `json:"-"`
	Path        string `json:"-"`
	URL         string `json:"url"`
	Token       string `json:"token"`
	User        string `json:"user"`
	Password    string `json:"password"`
	Creds       string `json:"creds"`
	NKey        string `json:"nkey"`
	Cert        string `json:"cert"`
	Key         string `json:"key"`
	CA          string `json:"ca"`
	InboxPrefix string `json:"inbox_prefix"`
	TLSFirst    bool   `json:"tls_first"`
	NSC         string `json:"nsc"`
}

// natsConfigDir is the nats CLI's configuration directory: $XDG_CONFIG_HOME/nats,
// else ~/.config/nats.
func natsConfigDir() (string, error) {
	if x := os.Getenv("XDG_CONFIG_HOME"); x != "" {
		return filepath.Join(x, "nats"), nil
	}
	home, err := os.UserHomeDir()
	if err != nil {
		return "", fmt.Errorf("no home directory for the nats CLI's contexts: %w", err)
	}
	return filepath.Join(home, ".config", "nats"), nil
}

// selectedContext returns the name in context.txt, "" when none is selected.
func selectedContext() (string, error) {
	dir, err := natsConfigDir()
	if err != nil {
		return "", nil // no home: no selected context
	}
	b, err := os.ReadFile(filepath.Join(dir, "context.txt"))
	if errors.Is(err, os.ErrNotExist) {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("selected nats context: %w", err)
	}
	return strings.TrimSpace(string(b)), nil
}

// loadContext reads the nats CLI context name. Paths in it may start with
// "~/" (the home directory).
func loadContext(name string) (*natsContext, error) {
	if name == "" || strings.Contains(name, "..") || strings.ContainsAny(name, `/\`) {
		return nil, fmt.Errorf("invalid nats context name %q", name)
	}
	dir, err := natsConfigDir()
	if err != nil {
		return nil, err
	}
	path := filepath.Join(dir, "context", name+".json")
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("unknown nats context %q (no %s)", name, path)
	}
	if err != nil {
		return nil, fmt.Errorf("nats context %q: %w", name, err)
	}
	c := &natsContext{Name: name, Path: path}
	if err := json.Unmarshal(b, c); err != nil {
		return nil, fmt.Errorf("nats context %q: %s: %w", name, path, err)
	}
	for _, p := range []*string{&c.Creds, &c.NKey, &c.Cert, &c.Key, &c.CA} {
		*p = expandHome(*p)
	}
	return c, nil
}

// expandHome replaces a leading "~/" by the home directory.
func expandHome(p string) string {
	if rest, ok := strings.CutPrefix(p, "~/"); ok {
		if home, err := os.UserHomeDir(); err == nil {
			return filepath.Join(home, rest)
		}
	}
	return p
}
