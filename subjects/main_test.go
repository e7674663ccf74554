package subjects

import (
	"os"
	"testing"

	"github.com/natsmesh/natsmesh/internal/raceexit"
)

func TestMain(m *testing.M) {
	raceexit.Exec() // first: see internal/raceexit
	os.Exit(m.Run())
}
