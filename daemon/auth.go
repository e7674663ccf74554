package daemon

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"strings"

	"github.com/nats-io/nkeys"
)

// Files of the embedded server's generated users (Config.Auth), in the auth
// directory: one nkey seed per permission profile (package profiles), mode
// 0600 in a 0700 directory. A node or service connects with NodeSeedFile,
// a caller through the ingress with ClientSeedFile, meshctl with
// OperatorSeedFile (nats.go nats.NkeyOptionFromSeed, the nats CLI's --nkey,
// meshd and meshctl --nkey).
const (
	AuthDirName      = "auth"
	NodeSeedFile     = "node.nk"
	ClientSeedFile   = "client.nk"
	OperatorSeedFile = "operator.nk"
)

// AuthKeys are the public nkeys of the generated users and the directory
// holding their seeds.
type AuthKeys struct {
	Dir                    string
	Node, Client, Operator string
}

// NodeSeed returns the path of the node profile's seed file.
func (k AuthKeys) NodeSeed() string { return filepath.Join(k.Dir, NodeSeedFile) }

// EnsureAuthKeys reads the three user seeds in dir, generating each one that
// is missing (the directory is created 0700, seeds are written 0600, so
// keys survive restarts and every process of the host that may read the
// directory uses the same ones). It refuses a seed file that others than
// its owner may read or write, and a file that is not a user seed.
func EnsureAuthKeys(dir string) (AuthKeys, error) {
	k := AuthKeys{Dir: dir}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return k, fmt.Errorf("daemon: auth dir: %w", err)
	}
	for _, f := range []struct {
		name string
		pub  *string
	}{{NodeSeedFile, &k.Node}, {ClientSeedFile, &k.Client}, {OperatorSeedFile, &k.Operator}} {
		pub, err := ensureSeed(filepath.Join(dir, f.name))
		if err != nil {
			return k, err
		}
		*f.pub = pub
	}
	return k, nil
}

// ensureSeed returns the public key of the user seed in path, creating the
// file with a new seed if it does not exist.
func ensureSeed(path string) (string, error) {
	data, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		kp, err := nkeys.CreateUser()
		if err != nil {
			return "", fmt.Errorf("daemon: generate nkey: %w", err)
		}
		seed, err := kp.Seed()
		if err != nil {
			return "", fmt.Errorf("daemon: generate nkey: %w", err)
		}
		f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
		if err != nil {
			return "", fmt.Errorf("daemon: write nkey seed: %w", err)
		}
		_, werr := f.Write(append(seed, '\n'))
		if cerr := f.Close(); werr == nil {
			werr = cerr
		}
		if werr != nil {
			return "", fmt.Errorf("daemon: write nkey seed %s: %w", path, werr)
		}
		return kp.PublicKey()
	}
	if err != nil {
		return "", fmt.Errorf("daemon: read nkey seed: %w", err)
	}
	st, err := os.Stat(path)
	if err != nil {
		return "", fmt.Errorf("daemon: nkey seed: %w", err)
	}
	if st.Mode().Perm()&0o077 != 0 {
		return "", fmt.Errorf("daemon: nkey seed %s has mode %v: others may read it (chmod 600 it, or delete it to generate a new one)", path, st.Mode().Perm())
	}
	kp, err := nkeys.FromSeed(bytes.TrimSpace(data))
	if err != nil {
		return "", fmt.Errorf("daemon: nkey seed %s: %w", path, err)
	}
	pub, err := kp.PublicKey()
	if err != nil || !strings.HasPrefix(pub, "U") {
		return "", fmt.Errorf("daemon: nkey seed %s is not a user seed", path)
	}
	return pub, nil
}

// loopback reports whether a listen address ("host:port") binds loopback
// only. An empty host or an unspecified address (0.0.0.0, ::) binds every
// interface.
func loopback(listen string) bool {
	host, _, err := net.SplitHostPort(listen)
	if err != nil {
		return false
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}
