package profiles_test

import (
	"os"
	"testing"

	"github.com/natsmesh/natsmesh/internal/natstest"
	"github.com/natsmesh/natsmesh/profiles"
)

// TestWriteSuiteAccounts writes, when NATSMESH_WRITE_SUITE_ACCOUNTS names a
// file, the accounts under which the other packages' suites can run with
// every connection holding the node profile: the user is the no_auth_user,
// with the node profile plus the default advisory wildcard the suites'
// nodes subscribe to. Run them so:
//
//	NATSMESH_WRITE_SUITE_ACCOUNTS=/tmp/node.conf go test ./profiles -run TestWriteSuiteAccounts
//	NATSMESH_TEST_ACCOUNTS=/tmp/node.conf NATSMESH_TEST_INBOX=_INBOX_mesh_v1 go test ./hub ./mesh/...
func TestWriteSuiteAccounts(t *testing.T) {
	t.Parallel()
	path := os.Getenv("NATSMESH_WRITE_SUITE_ACCOUNTS")
	if path == "" {
		t.Skip("NATSMESH_WRITE_SUITE_ACCOUNTS not set")
	}
	m := profiles.Mesh{}
	node := profiles.Node(m)
	node.Subscribe = append(node.Subscribe, "$SYS.ACCOUNT.*.DISCONNECT")
	conf := `accounts {
  SYS {
    exports: [{stream: "` + m.AdvisorySubject() + `", accounts: [MESH]}]
  }
  MESH {
    jetstream: enabled
    imports: [{stream: {account: SYS, subject: "` + m.AdvisorySubject() + `"}}]
    users: [{user: node, permissions: ` + node.Conf() + `}]
  }
}
system_account: SYS
no_auth_user: node
`
	natstest.RunServer(t, natstest.WithConfig(conf))
	if err := os.WriteFile(path, []byte(conf), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("wrote %s; inbox prefix %s", path, profiles.NodeInboxPrefix(m.Prefix))
}
