package reminders

import (
	"flag"
	"os"
	"runtime"
	"strconv"
	"testing"

	"github.com/natsmesh/natsmesh/internal/raceexit"
)

// TestMain runs this package's tests up to eight at a time (unless
// -parallel is given): each runs on a server of its own and spends its time
// waiting for the server's scheduler (a fire is due seconds ahead, the
// scheduling timer runs every 250 ms), not on the CPU — run two at a time
// (GOMAXPROCS on the 2-core machine) the package took 30 s of the README's
// quick suite, which must fit five minutes cold.
func TestMain(m *testing.M) {
	raceexit.Exec() // first: see internal/raceexit
	flag.Parse()
	set := false
	flag.Visit(func(f *flag.Flag) { set = set || f.Name == "test.parallel" })
	if !set {
		_ = flag.Set("test.parallel", strconv.Itoa(max(8, runtime.GOMAXPROCS(0))))
	}
	os.Exit(m.Run())
}
