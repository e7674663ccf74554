package mesh

import (
	"context"
	"testing"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/natsmesh/natsmesh/internal/natstest"
	"github.com/natsmesh/natsmesh/mesh/directory"
	"github.com/natsmesh/natsmesh/mesh/membership"
	"github.com/natsmesh/natsmesh/subjects"
)

func bucket(t *testing.T, s *server.Server, name string) jetstream.KeyValue {
	t.Helper()
	js, err := jetstream.New(natstest.Connect(t, s))
	if err != nil {
		t.Fatal(err)
	}
	kv, err := js.KeyValue(context.Background(), name)
	if err != nil {
		t.Fatal(err)
	}
	return kv
}

func mustKV(t *testing.T, s *server.Server) jetstream.KeyValue {
	return bucket(t, s, membership.BucketName(subjects.DefaultPrefix))
}

func mustDir(t *testing.T, s *server.Server) jetstream.KeyValue {
	return bucket(t, s, directory.BucketName(subjects.DefaultPrefix))
}
