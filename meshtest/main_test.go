package meshtest_test

import (
	"os"
	"testing"

	"github.com/natsmesh/natsmesh/internal/natstest"
	"github.com/natsmesh/natsmesh/internal/raceexit"
)

func TestMain(m *testing.M) {
	raceexit.Exec() // first: see internal/raceexit
	natstest.RaiseParallel(8)
	os.Exit(m.Run())
}
