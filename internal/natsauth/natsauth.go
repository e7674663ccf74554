// Package natsauth checks the credential and TLS files a NATS connection is
// given before anything is dialed, reading them as nats.go will, so that a
// missing or unreadable file is reported as the bad setting it is rather than
// as a failed connection; and it tells a login the server refused apart
// from a server that cannot be reached.
package natsauth

import (
	"errors"
	"fmt"
	"os"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats.go"
)

// CheckCreds checks a credentials file (nats.UserCredentials): it must hold
// a user JWT and the user's nkey seed. The error says what is wrong with it.
func CheckCreds(path string) error {
	if err := CheckReadable(path); err != nil {
		return err
	}
	var o nats.Options
	if err := nats.UserCredentials(path)(&o); err != nil {
		return err
	}
	tok, err := o.UserJWT()
	if err != nil {
		return fmt.Errorf("no user JWT in it: %v", err)
	}
	if _, err := jwt.DecodeUserClaims(tok); err != nil {
		return fmt.Errorf("no user JWT in it (want the JWT and seed a credentials file holds): %v", err)
	}
	if _, err := o.SignatureCB([]byte("natsauth")); err != nil {
		return fmt.Errorf("no nkey seed in it: %v", errors.Unwrap(err))
	}
	return nil
}

// CheckNKey checks an nkey seed file (nats.NkeyOptionFromSeed): it must
// hold a user seed.
func CheckNKey(path string) error {
	if err := CheckReadable(path); err != nil {
		return err
	}
	_, err := nats.NkeyOptionFromSeed(path)
	return err
}

// CheckCA checks a file of CA certificates (nats.RootCAs): PEM, at least
// one certificate.
func CheckCA(path string) error {
	if err := CheckReadable(path); err != nil {
		return err
	}
	var o nats.Options
	return nats.RootCAs(path)(&o)
}

// CheckClientCert checks a TLS client certificate and its key
// (nats.ClientCert): PEM files that belong together.
func CheckClientCert(cert, key string) error {
	var o nats.Options
	return nats.ClientCert(cert, key)(&o)
}

// CheckReadable checks that path is a file this process can read.
func CheckReadable(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return err
	}
	if st.IsDir() {
		return fmt.Errorf("%s is a directory, not a file", path)
	}
	return nil
}

// LoginRefused reports whether err, from nats.Connect, is the server
// refusing the login (no, wrong, expired or revoked credentials:
// "Authorization Violation" and its kin; or an nkey given to a server
// that has no nkey users, which nats.go refuses before logging in with
// nats.ErrNkeysNotSupported), as opposed to a server that cannot be
// reached.
func LoginRefused(err error) bool {
	return errors.Is(err, nats.ErrAuthorization) || errors.Is(err, nats.ErrAuthExpired) ||
		errors.Is(err, nats.ErrAuthRevoked) || errors.Is(err, nats.ErrAccountAuthExpired) ||
		errors.Is(err, nats.ErrNkeysNotSupported)
}
