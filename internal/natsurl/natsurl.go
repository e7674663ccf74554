// Package natsurl checks a NATS server URL list before it is dialed, so that
// a malformed one is reported as bad input rather than as the DNS or dial
// failure nats.go would meet with it.
package natsurl

import (
	"errors"
	"fmt"
	"net"
	"net/url"
	"strconv"
	"strings"
)

// Validate checks list, the server URLs nats.Connect takes: comma-separated,
// blanks around each ignored, each nats://, tls://, ws:// or wss:// with a
// host and an optional port (1-65535) and user info, or a bare HOST[:PORT]
// (nats.go adds the scheme). Only ws:// and wss:// may have a path, and
// websocket and other URLs may not be mixed (nats.go refuses that too).
//
// It returns nil for a list nats.go would dial as written, else an error
// saying what is wrong, one line, naming the bad URL when the list has
// several; the caller names the flag or variable it came from. It dials
// nothing and resolves no name.
func Validate(list string) error {
	var urls []string
	for u := range strings.SplitSeq(list, ",") {
		if u = strings.TrimSpace(u); u != "" {
			urls = append(urls, u)
		}
	}
	if len(urls) == 0 {
		return errors.New("no server URL (want nats://HOST:PORT; several comma-separated)")
	}
	ws := 0
	for _, u := range urls {
		isWS, err := check(u)
		if err != nil {
			if len(urls) > 1 {
				return fmt.Errorf("%q: %w", u, err)
			}
			return err
		}
		if isWS {
			ws++
		}
	}
	if ws > 0 && ws < len(urls) {
		return errors.New("websocket (ws://, wss://) and other URLs mixed in one list")
	}
	return nil
}

// check validates one URL and reports whether it is a websocket URL.
func check(raw string) (ws bool, err error) {
	s := raw
	if !strings.Contains(s, "://") {
		if strings.Contains(s, "/") {
			return false, errors.New(`not a NATS URL: no "://" after the scheme (want nats://HOST:PORT)`)
		}
		s = "nats://" + s
	}
	u, err := url.Parse(s)
	if err != nil {
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err
		}
		return false, fmt.Errorf("not a NATS URL: %v (want nats://HOST:PORT)", err)
	}
	switch u.Scheme {
	case "nats", "tls":
		if u.Path != "" && u.Path != "/" {
			return false, fmt.Errorf("not a NATS URL: it has a path %q (want nats://HOST:PORT)", u.Path)
		}
	case "ws", "wss":
		ws = true
	default:
		return false, fmt.Errorf("scheme %q is not nats, tls, ws or wss (want nats://HOST:PORT)", u.Scheme)
	}
	if u.Opaque != "" || u.Host == "" {
		return false, errors.New("not a NATS URL: no host (want nats://HOST:PORT)")
	}
	hostPort := u.Host
	if u.Port() == "" {
		hostPort = strings.TrimSuffix(hostPort, ":") + ":4222"
	}
	host, port, err := net.SplitHostPort(hostPort)
	if err != nil {
		var ae *net.AddrError
		if errors.As(err, &ae) {
			err = errors.New(ae.Err)
		}
		return false, fmt.Errorf("not a NATS URL: host %q: %v (want nats://HOST:PORT)", u.Host, err)
	}
	if host == "" {
		return false, errors.New("not a NATS URL: no host (want nats://HOST:PORT)")
	}
	if p, err := strconv.Atoi(port); err != nil || p < 1 || p > 65535 {
		return false, fmt.Errorf("port %s is not 1-65535", port)
	}
	return ws, nil
}
