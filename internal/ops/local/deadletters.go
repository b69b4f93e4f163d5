package local

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/proteanhq/protean-host/internal/ops"

	"github.com/proteanhq/protean-host/broker"
	"github.com/proteanhq/protean-host/internal/groups"
	"github.com/proteanhq/protean-host/internal/redisstream"
)

// storeLister is a broker that lists every dead letter it keeps, of
// groups that no longer run and of partitions too (redisstream.Broker):
// stream "" for all its DLQ streams, at most perStream of each.
type storeLister interface {
	DeadLetters(ctx context.Context, stream string, perStream int) ([]redisstream.DeadLetter, error)
}

// errNoDeadLetters: the host's broker keeps none.
var errNoDeadLetters = fmt.Errorf("%w: this host's broker keeps no dead letters", ops.ErrNotFound)

// groups returns the running broker groups.
func (s *Service) groups() []groups.Group {
	if s.o.Groups == nil {
		return nil
	}
	return s.o.Groups()
}

// DeadLetters implements API.
func (s *Service) DeadLetters(ctx context.Context, sc ops.Scope) ([]ops.DeadLetter, error) {
	out := []ops.DeadLetter{}
	if s.o.DeadLetters == nil {
		return out, nil
	}
	dls, err := s.stored(ctx, "")
	if err != nil {
		return nil, err
	}
	ts, running := s.tenants(), s.groups()
	for _, dl := range dls {
		t := ts[dl.Group]
		if !sc.Has(t) {
			continue
		}
		d := ops.DeadLetter{Tenant: t, Group: dl.Group, Stream: dl.Stream, ID: dl.ID, Type: dl.Type, GlobalPosition: dl.GlobalPosition,
			Reason: dl.Reason, Attempts: dl.Attempts, FailedAt: dl.FailedAt, Source: "group", Data: string(dl.Data)}
		if dl.Unit != "" {
			d.Source = "partition"
		} else {
			d.Replayable = slices.Contains(running, groups.Group{Handler: dl.Group, Stream: dl.Stream})
		}
		if len(d.Data) > 200 {
			d.Data = d.Data[:200] + "…"
		}
		out = append(out, d)
	}
	return out, nil
}

// stored lists the dead letters of stream ("": of every stream), at most
// MaxDeadLetters of each: all the broker keeps if it can list them, else
// the running groups'.
func (s *Service) stored(ctx context.Context, stream string) ([]redisstream.DeadLetter, error) {
	if l, ok := s.o.DeadLetters.(storeLister); ok {
		return l.DeadLetters(ctx, stream, ops.MaxDeadLetters)
	}
	var out []redisstream.DeadLetter
	n := map[string]int{}
	for _, g := range s.groups() {
		if stream != "" && g.Stream != stream {
			continue
		}
		dls, err := s.o.DeadLetters.DLQ(ctx, g.Stream, g.Handler)
		if err != nil {
			return nil, err
		}
		for _, dl := range dls {
			if n[g.Stream] == ops.MaxDeadLetters {
				break
			}
			n[g.Stream]++
			dl.Stream = g.Stream
			out = append(out, redisstream.DeadLetter{DeadLetter: dl})
		}
	}
	return out, nil
}

// ReplayDeadLetter implements API.
func (s *Service) ReplayDeadLetter(ctx context.Context, sc ops.Scope, act ops.Act, stream, group, id string) (ops.Done, error) {
	if err := ops.CheckReplay(act); err != nil {
		return ops.Done{}, err
	}
	if stream == "" || group == "" || id == "" {
		return ops.Done{}, fmt.Errorf("%w: a dead letter is named by its stream, group and message id, none empty", ops.ErrInvalid)
	}
	tenant := s.tenants()[group]
	if !sc.Has(tenant) {
		return ops.Done{}, hidden(sc, fmt.Errorf("%w: no dead letter %s of group %s on stream %s", ops.ErrNotFound, id, group, stream))
	}
	if s.o.DeadLetters == nil {
		return ops.Done{}, errNoDeadLetters // the group is the scope's: nothing to hide
	}
	target := stream + " " + group + " " + id
	aid, err := s.record(ctx, act, "deadletters", tenant, target, s.replay(ctx, stream, group, id))
	if err != nil {
		return ops.Done{}, err
	}
	return ops.Done{Tenant: tenant, Action: act.Action, Target: target, Audit: aid,
		Detail: fmt.Sprintf("dead letter %s is back at the head of group %s's line on stream %s, with fresh attempts", id, group, stream)}, nil
}

// replay replays a running group's dead letter; a partition's, or one of
// a group that does not run, is refused.
func (s *Service) replay(ctx context.Context, stream, group, id string) error {
	if !slices.Contains(s.groups(), groups.Group{Handler: group, Stream: stream}) {
		dls, err := s.stored(ctx, stream)
		if err != nil {
			return err
		}
		for _, dl := range dls {
			if dl.Unit != "" && dl.Group == group {
				// The partition's workers fence by global position and read
				// no requeue line: the broker cannot put it back.
				return fmt.Errorf("%w: stream %s is partition %s's, and partitions' dead letters are replayed by hand, not through the broker (see protean-host dead-letters --help)",
					ops.ErrConflict, stream, dl.Unit)
			}
		}
		return fmt.Errorf("%w: group %s does not read stream %s on this host, so nothing would deliver its dead letters again", ops.ErrNotFound, group, stream)
	}
	err := s.o.DeadLetters.Replay(ctx, stream, group, id)
	switch {
	case errors.Is(err, broker.ErrNotDeadLettered):
		err = fmt.Errorf("%w: %w", ops.ErrNotFound, err)
	case errors.Is(err, broker.ErrInvalid):
		err = fmt.Errorf("%w: %w", ops.ErrInvalid, err)
	}
	return err
}
