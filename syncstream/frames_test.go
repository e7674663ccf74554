package syncstream_test

import (
	"bytes"
	"errors"
	"fmt"
	"math"
	"strings"
	"testing"

	"github.com/natsmesh/natsmesh/syncstream"
)

// sameFrames compares frames, an empty Data equal to none.
func sameFrames(a, b []syncstream.Frame) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		x, y := a[i], b[i]
		if x.Epoch != y.Epoch || x.Version != y.Version || x.Snapshot != y.Snapshot || x.Closed != y.Closed ||
			x.Attempt != y.Attempt || !bytes.Equal(x.Data, y.Data) {
			return false
		}
	}
	return true
}

func TestFramesRoundTrip(t *testing.T) {
	t.Parallel()
	big := bytes.Repeat([]byte{0xA5}, 70000)
	cases := [][]syncstream.Frame{
		{{}},
		{{Epoch: 1, Version: 1, Data: []byte("x")}},
		{{Epoch: math.MaxUint64, Version: math.MaxUint64}},
		{{Epoch: 1764597600000000000, Version: 0, Snapshot: true, Attempt: "Fz3uTW1ZbWrN5kB9Xx7Jq2", Data: []byte(`{"a":"1"}`)}},
		{{Epoch: 7, Closed: true}},
		{{Epoch: 5, Version: 9, Snapshot: true, Attempt: strings.Repeat("a", syncstream.MaxAttemptLen), Data: big}},
		{{Epoch: 3, Version: 1, Snapshot: true, Attempt: "a"}, {Epoch: 3, Version: 2, Data: []byte{0}}, {Epoch: 3, Version: 3, Data: big}, {Epoch: 3, Closed: true}},
	}
	for i, fs := range cases {
		p := syncstream.AppendFrames(nil, fs...)
		if p[0] != syncstream.FramesFormat {
			t.Fatalf("case %d: format byte %d", i, p[0])
		}
		got, err := syncstream.DecodeFrames(p)
		if err != nil {
			t.Fatalf("case %d: %v", i, err)
		}
		if !sameFrames(got, fs) {
			t.Errorf("case %d: got %+v, want %+v", i, got, fs)
		}
		// Appending records to an encoding extends it.
		more := syncstream.AppendFrames(append([]byte(nil), p...), fs...)
		if got, err := syncstream.DecodeFrames(more); err != nil || !sameFrames(got, append(append([]syncstream.Frame(nil), fs...), fs...)) {
			t.Errorf("case %d: extended: %v", i, err)
		}
	}
}

// TestFramesDataAliasesBounded: a decoded frame's Data may be appended to
// without overwriting the next frame.
func TestFramesDataAliasesBounded(t *testing.T) {
	t.Parallel()
	p := syncstream.AppendFrames(nil, syncstream.Frame{Epoch: 1, Version: 1, Data: []byte("ab")}, syncstream.Frame{Epoch: 1, Version: 2, Data: []byte("cd")})
	fs, err := syncstream.DecodeFrames(p)
	if err != nil {
		t.Fatal(err)
	}
	_ = append(fs[0].Data, 'X', 'X', 'X', 'X', 'X')
	if again, _ := syncstream.DecodeFrames(p); string(again[1].Data) != "cd" {
		t.Errorf("append to frame 0 changed frame 1: %q", again[1].Data)
	}
}

func TestDecodeFramesRejects(t *testing.T) {
	t.Parallel()
	good := syncstream.AppendFrames(nil, syncstream.Frame{Epoch: 300, Version: 2, Attempt: "att", Data: []byte("data")})
	cases := map[string][]byte{
		"empty":              nil,
		"format only":        {1},
		"unknown format":     append([]byte{2}, good[1:]...),
		"json frame":         []byte(`{"epoch":1,"version":1,"data":"eA=="}`),
		"unknown flag":       {1, 4, 1, 1, 0, 0},
		"snapshot closed":    {1, 3, 1, 1, 0, 0},
		"no epoch":           {1, 0},
		"truncated epoch":    {1, 0, 0x80},
		"epoch overflow":     {1, 0, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f, 1, 0, 0},
		"no version":         {1, 0, 1},
		"no attempt":         {1, 0, 1, 1},
		"attempt too long":   append([]byte{1, 0, 1, 1, 0x81, 0x02}, make([]byte, 257+1)...),
		"attempt past end":   {1, 0, 1, 1, 5, 'a'},
		"no data length":     {1, 0, 1, 1, 0},
		"data past end":      {1, 0, 1, 1, 0, 3, 'a', 'b'},
		"huge data length":   {1, 0, 1, 1, 0, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01},
		"good then garbage":  append(append([]byte(nil), good...), 0),
		"good then trailing": append(append([]byte(nil), good...), good[1:len(good)-1]...),
	}
	for i := 1; i < len(good); i++ { // every strict prefix
		cases[fmt.Sprintf("prefix %d", i)] = good[:i]
	}
	for name, p := range cases {
		fs, err := syncstream.DecodeFrames(p)
		if err == nil {
			t.Errorf("%s: decoded %+v", name, fs)
			continue
		}
		if !errors.Is(err, syncstream.ErrMalformedFrames) {
			t.Errorf("%s: error %v does not wrap ErrMalformedFrames", name, err)
		}
	}
}

// FuzzDecodeFrames: DecodeFrames never panics, and what it accepts encodes
// back to frames it decodes the same.
func FuzzDecodeFrames(f *testing.F) {
	f.Add(syncstream.AppendFrames(nil, syncstream.Frame{Epoch: 1, Version: 2, Data: []byte("x")}))
	f.Add(syncstream.AppendFrames(nil, syncstream.Frame{Epoch: 9, Snapshot: true, Attempt: "a"}, syncstream.Frame{Epoch: 9, Version: 1}, syncstream.Frame{Epoch: 9, Closed: true}))
	f.Add([]byte{1, 0, 0x80, 0x00, 0, 0, 0})
	f.Add([]byte(`{"epoch":1}`))
	f.Fuzz(func(t *testing.T, p []byte) {
		fs, err := syncstream.DecodeFrames(p)
		if err != nil {
			if !errors.Is(err, syncstream.ErrMalformedFrames) {
				t.Fatalf("error %v does not wrap ErrMalformedFrames", err)
			}
			return
		}
		if len(fs) == 0 {
			t.Fatal("no frames and no error")
		}
		again, err := syncstream.DecodeFrames(syncstream.AppendFrames(nil, fs...))
		if err != nil || !sameFrames(again, fs) {
			t.Fatalf("re-encoded %+v: %+v, %v", fs, again, err)
		}
	})
}

// TestFramesGolden pins the example of docs/protocol.md §8a, for other
// implementations: one delta frame, epoch 150, version 3, data "hi".
func TestFramesGolden(t *testing.T) {
	t.Parallel()
	want := []byte{0x01, 0x00, 0x96, 0x01, 0x03, 0x00, 0x02, 'h', 'i'}
	f := syncstream.Frame{Epoch: 150, Version: 3, Data: []byte("hi")}
	if got := syncstream.AppendFrames(nil, f); !bytes.Equal(got, want) {
		t.Errorf("encoded % x, want % x", got, want)
	}
	if got, err := syncstream.DecodeFrames(want); err != nil || !sameFrames(got, []syncstream.Frame{f}) {
		t.Errorf("decoded %+v, %v", got, err)
	}
}
