package mesh

import (
	"os"
	"testing"

	"github.com/natsmesh/natsmesh/internal/natstest"
)

func TestMain(m *testing.M) {
	natstest.RaiseParallel(8)
	os.Exit(m.Run())
}
