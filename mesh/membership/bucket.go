package membership

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/natsmesh/natsmesh/subjects"
)

// OpenBucket creates or binds the registry bucket: memory storage, the
// configured replicas, history 1, the mesh's TTL in its metadata, a MaxAge
// backstop of BackstopFactor × TTL, and markers on expiry so watchers see
// backstop removals.
//
// An existing bucket is used as it is, never reconfigured: the mesh's TTL
// is the bucket's, set by the first node, so one node with other settings
// cannot change every node's expiry (Join adapts its heartbeat to it).
// A non-empty cluster places a bucket it creates there (Placement).
func OpenBucket(ctx context.Context, js jetstream.JetStream, p subjects.Prefix, ttl time.Duration, replicas int, cluster string) (jetstream.KeyValue, error) {
	return bindOrCreate(ctx, js, jetstream.KeyValueConfig{
		Placement:      Placement(cluster),
		Bucket:         BucketName(p),
		Description:    "natsmesh node registry",
		Storage:        jetstream.MemoryStorage,
		Replicas:       replicas,
		History:        1,
		TTL:            BackstopFactor * ttl,
		LimitMarkerTTL: max(ttl, time.Second),
		Metadata:       map[string]string{metaTTL: ttl.String()},
	})
}

// Placement returns the JetStream placement in the NATS cluster named
// cluster, or nil (the server's default: the requester's cluster) when it
// is empty (DESIGN §12: the mesh's streams live in one home cluster).
func Placement(cluster string) *jetstream.Placement {
	if cluster == "" {
		return nil
	}
	return &jetstream.Placement{Cluster: cluster}
}

// RegistryTTL returns the mesh's TTL as the registry bucket records it (in
// its metadata; for a registry of an older version, its MaxAge).
func RegistryTTL(st jetstream.KeyValueStatus) time.Duration {
	if kst, ok := st.(*jetstream.KeyValueBucketStatus); ok {
		if v, ok := kst.StreamInfo().Config.Metadata[metaTTL]; ok {
			if d, err := time.ParseDuration(v); err == nil && d > 0 {
				return d
			}
		}
	}
	return st.TTL() // a registry of an older version: its MaxAge is the TTL
}

// bindOrCreate binds the bucket if it exists, else creates it.
func bindOrCreate(ctx context.Context, js jetstream.JetStream, cfg jetstream.KeyValueConfig) (jetstream.KeyValue, error) {
	kv, err := js.KeyValue(ctx, cfg.Bucket)
	if err == nil {
		return kv, nil
	}
	if !errors.Is(err, jetstream.ErrBucketNotFound) {
		return nil, err
	}
	kv, err = js.CreateKeyValue(ctx, cfg)
	if errors.Is(err, jetstream.ErrBucketExists) {
		return js.KeyValue(ctx, cfg.Bucket) // created concurrently
	}
	return kv, err
}

// BindOrCreate is bindOrCreate for the directory's bucket.
func BindOrCreate(ctx context.Context, js jetstream.JetStream, cfg jetstream.KeyValueConfig) (jetstream.KeyValue, error) {
	return bindOrCreate(ctx, js, cfg)
}

// Retry runs op until it succeeds, fails with an error that is not a
// JetStream start-up condition, or ctx ends. Right after a JetStream cluster
// forms or a bucket is created, its stream may have no leader yet: requests
// meet no responders or time out for a moment.
func Retry(ctx context.Context, op func() error) error {
	wait := 50 * time.Millisecond
	for {
		err := op()
		if err == nil || !transient(err) {
			return err
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w (last: %w)", ctx.Err(), err)
		case <-time.After(wait): // real clock: paces JetStream round trips awaiting a leader (package-level, no clock)
		}
		wait = min(2*wait, time.Second)
	}
}

// RetryEach is Retry with each attempt given its own ctx, bounded by
// AttemptTimeout within ctx. While it keeps failing it logs what it waits
// for (what, the attempt count and the last error) on log, at most every
// two seconds, so a node that cannot start says why; log may be nil.
func RetryEach(ctx context.Context, log *slog.Logger, what string, op func(ctx context.Context) error) error {
	return retryEach(ctx, AttemptTimeout, log, what, op)
}

func retryEach(ctx context.Context, per time.Duration, log *slog.Logger, what string, op func(ctx context.Context) error) error {
	start, logged, attempts := time.Now(), time.Time{}, 0 // real clock: log throttling and "waited"
	return Retry(ctx, func() error {
		attempts++
		actx, cancel := context.WithTimeout(ctx, per)
		err := op(actx)
		cancel()
		if err != nil && log != nil && transient(err) && time.Since(logged) >= 2*time.Second {
			logged = time.Now()
			log.Warn("waiting for JetStream: "+what, "attempts", attempts, "waited", time.Since(start).Round(time.Millisecond).String(), "err", err)
		}
		return err
	})
}

func transient(err error) bool {
	var apiErr *jetstream.APIError
	return errors.Is(err, nats.ErrNoResponders) || errors.Is(err, nats.ErrTimeout) ||
		errors.Is(err, context.DeadlineExceeded) || errors.Is(err, jetstream.ErrNoStreamResponse) ||
		// "no suitable peers for placement": right after a cluster forms
		// (or a server restarts) its peers may still be reported offline.
		errors.As(err, &apiErr) && apiErr.ErrorCode == errCodeNoPeers
}
