package natsauth

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"
)

func write(t *testing.T, name, content string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// files are valid credentials, seed, CA and client certificate files.
type files struct{ creds, seed, ca, cert, key string }

func newFiles(t *testing.T) files {
	t.Helper()
	acct, _ := nkeys.CreateAccount()
	user, _ := nkeys.CreateUser()
	upub, _ := user.PublicKey()
	useed, _ := user.Seed()
	tok, err := jwt.NewUserClaims(upub).Encode(acct)
	if err != nil {
		t.Fatal(err)
	}
	creds, err := jwt.FormatUserConfig(tok, useed)
	if err != nil {
		t.Fatal(err)
	}
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "test"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	kder, _ := x509.MarshalECPrivateKey(key)
	certPEM := string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}))
	return files{
		creds: write(t, "user.creds", string(creds)),
		seed:  write(t, "user.nk", string(useed)),
		ca:    write(t, "ca.pem", certPEM),
		cert:  write(t, "cert.pem", certPEM),
		key:   write(t, "key.pem", string(pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder}))),
	}
}

func TestChecks(t *testing.T) {
	f := newFiles(t)
	garbage := write(t, "garbage", "not a credential\n")
	missing := filepath.Join(t.TempDir(), "missing")
	dir := t.TempDir()
	for _, tc := range []struct {
		name  string
		check func(string) error
		ok    []string
		bad   []string
	}{
		{"creds", CheckCreds, []string{f.creds}, []string{garbage, missing, dir, f.seed, f.ca}},
		{"nkey", CheckNKey, []string{f.seed}, []string{garbage, missing, dir, f.ca}},
		{"ca", CheckCA, []string{f.ca}, []string{garbage, missing, dir, f.seed}},
		{"readable", CheckReadable, []string{f.ca, garbage}, []string{missing, dir}},
	} {
		for _, p := range tc.ok {
			if err := tc.check(p); err != nil {
				t.Errorf("%s %s: %v", tc.name, filepath.Base(p), err)
			}
		}
		for _, p := range tc.bad {
			err := tc.check(p)
			if err == nil {
				t.Errorf("%s %s accepted", tc.name, filepath.Base(p))
			} else if strings.Contains(err.Error(), "\n") {
				t.Errorf("%s %s: %q is not one line", tc.name, filepath.Base(p), err)
			}
		}
	}
	if err := CheckClientCert(f.cert, f.key); err != nil {
		t.Errorf("client cert: %v", err)
	}
	if err := CheckClientCert(f.cert, garbage); err == nil {
		t.Error("client cert with a garbage key accepted")
	}
}

func TestLoginRefused(t *testing.T) {
	for _, err := range []error{nats.ErrAuthorization, nats.ErrAuthExpired, nats.ErrAuthRevoked, fmt.Errorf("connect: %w", nats.ErrAuthorization)} {
		if !LoginRefused(err) {
			t.Errorf("%v: not a refused login", err)
		}
	}
	for _, err := range []error{nil, nats.ErrNoServers, nats.ErrTimeout} {
		if LoginRefused(err) {
			t.Errorf("%v: a refused login", err)
		}
	}
}
