package httpapi

import (
	"context"
	"time"

	"github.com/proteanhq/protean-host/abi"
	"github.com/proteanhq/protean-host/internal/engine"
	"github.com/proteanhq/protean-host/internal/host"
)

// Status is what GET / (the status page) and GET /v1/plugins show beyond
// the engine's running set: the last plugin reload, the consumers, the
// outbox and the partitions. It reads the same sources as /metrics and
// the CLI (the reloader, the broker's and partitions' admin views, the
// outbox's stats); cmd/protean-host implements it. Optional: without
// one, both pages show the running set only.
type Status interface {
	Status(ctx context.Context) (Snapshot, error)
}

// Snapshot is one reading of the host's state.
type Snapshot struct {
	// Reload is the last plugin reload; nil before the first.
	Reload *host.ReloadStatus
	// Consumers lists each consumer group's delivery, by group and
	// source.
	Consumers []Consumer
	// Outbox is nil when it could not be read (Problems says why).
	Outbox *Outbox
	// Partitions is nil when Redis partitions are off.
	Partitions *Partitions
	// Pools are the connection pools (none with memory stores and the
	// inline broker).
	Pools []Pool
	// Tenants are each tenant's use of the guests: calls, queue wait,
	// guest time, instances, guest memory, compiled code.
	Tenants []host.TenantStats
	// Problems are the parts that could not be read, one line each.
	Problems []string
}

// Pool is one connection pool's size, use and waits since the start.
type Pool struct {
	Name  string `json:"name"`
	Max   int64  `json:"max"`
	InUse int64  `json:"in_use"`
	Idle  int64  `json:"idle"`
	// Acquires counts the connections taken; Waits those takes that found
	// no idle connection and waited, WaitSeconds how long in all.
	Acquires    int64   `json:"acquires"`
	Waits       int64   `json:"waits"`
	WaitSeconds float64 `json:"wait_seconds"`
	// Timeouts counts the waits that gave up (Redis).
	Timeouts int64 `json:"timeouts,omitempty"`
}

// Consumer is one consumer group reading one source (a category, or the
// partitions of a group).
type Consumer struct {
	Group  string `json:"group"`
	Source string `json:"source"`
	// Path is how it is delivered: "inline", "stream", "partitions" or
	// "event_store".
	Path string `json:"path"`
	// Lag counts what waits for the group: messages not yet delivered
	// or in flight (inline, stream), entries not yet delivered across
	// the partitions, or global positions behind the category's head
	// (event store).
	Lag int64 `json:"lag"`
	// Failures counts what the group gave up on or is stuck on:
	// dead-lettered messages, halted partitions, open failure records.
	Failures int64 `json:"failures"`
}

// Outbox is the outbox's row counts, its oldest pending row's age, and
// who holds each broker's relay lease.
type Outbox struct {
	Counts map[string]int `json:"counts"`
	// OldestPending is zero when nothing is pending.
	OldestPending time.Duration `json:"oldest_pending_ns"`
	RelayLeases   []RelayLease  `json:"relay_leases,omitempty"`
}

// RelayLease is a broker's relay lease as recorded: the host whose relay
// claims the broker's rows, for Left more unless it renews; a lease
// whose Left is zero or less has lapsed, and the next relay to try takes
// it.
type RelayLease struct {
	Broker string        `json:"broker"`
	Owner  string        `json:"owner"`
	Left   time.Duration `json:"left_ns"`
}

// Lapsed is how long ago a lapsed lease ran out (0 while it holds).
func (l RelayLease) Lapsed() time.Duration { return max(0, -l.Left) }

// Partitions lists the units that are owned or halted.
type Partitions struct {
	Owned  []Unit `json:"owned"`
	Halted []Unit `json:"halted"`
}

// Unit is one partition (or correlated process-manager value) of a
// consumer group.
type Unit struct {
	Group      string `json:"group"`
	Unit       string `json:"unit"`
	Owner      string `json:"owner,omitempty"`
	Generation int64  `json:"generation,omitempty"` // the lease's; 0: none
	// Pending counts the delivered, unacknowledged entries (a halted
	// unit's head among them), Lag those not delivered yet: the columns
	// of protean-host partitions list.
	Pending int64 `json:"pending"`
	Lag     int64 `json:"lag"`
	// Reason is a halted unit's halt reason, and HaltGeneration the lease
	// generation it halted under, Attempts its head's attempts.
	Reason         string `json:"reason,omitempty"`
	HaltGeneration int64  `json:"halt_generation,omitempty"`
	Attempts       int    `json:"attempts,omitempty"`
}

// Plugin describes a module for GET /v1/plugins: a running one, or a
// file a reload rejected that is not running.
type Plugin struct {
	File    string `json:"file"`
	Name    string `json:"name,omitempty"`
	Version string `json:"version,omitempty"`
	SHA256  string `json:"sha256,omitempty"`
	ABI     int    `json:"abi_version,omitempty"`
	// Tenant is the module's tenant: the running module's, or, for a
	// rejected file that is not running, the tenant config gives it.
	Tenant string `json:"tenant,omitempty"`
	// State is "running", or "rejected" for a file a reload refused
	// that is not running.
	State string `json:"state"`
	// LastError is Rejected's error, for clients that read only it.
	LastError string `json:"last_error,omitempty"`
	// Rejected is the file's bytes a reload refused, with why and since
	// when: for a running module, the version on disk that was held back
	// (the running version, the fields above, keeps serving). It is
	// cleared once a version of the file loads, or the file is removed.
	Rejected *host.Rejection `json:"rejected,omitempty"`
	Handlers []PluginHandler `json:"handlers"`
	// Instances are a running module's instances (host.InstanceStats).
	Instances *host.InstanceStats `json:"instances,omitempty"`
}

// PluginHandler is a handler as the manifest declares it, with the
// categories it reads or writes and each one's partition key.
type PluginHandler struct {
	abi.Handler
	Categories []string `json:"categories"`
	// PartitionKeys maps each partitioned category of the handler to its
	// key field.
	PartitionKeys map[string]string `json:"partition_keys,omitempty"`
	// ReadYourWrites is what a ?min_position read of a projector's or
	// process manager's document waits for: "key" (only the events of
	// the document's partition key: the projector declares
	// documents_by_key) or "all" (every event of its categories).
	ReadYourWrites string `json:"read_your_writes,omitempty"`
}

// KeyText is the handler's partition keys for a person, as `protean-host
// validate` prints them (host.Partitioning.KeyText); "" when none.
func (h PluginHandler) KeyText() string {
	return host.Partitioning{Categories: h.Categories, Keys: h.PartitionKeys,
		Correlated: host.Correlated(h.Handler)}.KeyText()
}

// Plugins lists the running modules of set, then the files rejected now
// that are not running; a running module whose file on disk was rejected
// carries that rejection beside its running version.
func Plugins(set *host.Set, reload *host.ReloadStatus) []Plugin {
	rejected := map[string]*host.Rejection{}
	var files []string
	if reload != nil {
		for _, rj := range reload.Rejected {
			rejected[rj.File] = &rj
			files = append(files, rj.File)
		}
	}
	lastError := func(f string) string {
		if rj := rejected[f]; rj != nil {
			return rj.Error
		}
		return ""
	}
	out := []Plugin{}
	running := map[string]bool{}
	for _, m := range set.Modules() {
		running[m.File] = true
		inst := m.Instances()
		p := Plugin{File: m.File, Name: m.Manifest.Module.Name, Version: m.Manifest.Module.Version,
			SHA256: m.SHA256, ABI: m.Manifest.ABIVersion, Tenant: m.Tenant, State: "running", LastError: lastError(m.File),
			Rejected: rejected[m.File], Handlers: []PluginHandler{}, Instances: &inst}
		for _, h := range m.Manifest.Handlers {
			p.Handlers = append(p.Handlers, handlerOf(set, h))
		}
		out = append(out, p)
	}
	for _, f := range files {
		if !running[f] {
			out = append(out, Plugin{File: f, Tenant: rejected[f].Tenant, State: "rejected", LastError: lastError(f), Rejected: rejected[f], Handlers: []PluginHandler{}})
		}
	}
	return out
}

func handlerOf(set *host.Set, h abi.Handler) PluginHandler {
	p := set.Partitioning(h)
	ph := PluginHandler{Handler: h, Categories: p.Categories, PartitionKeys: p.Keys}
	if h.Kind == abi.KindProjector || h.Kind == abi.KindProcessManager {
		ph.ReadYourWrites = engine.ReadYourWrites(h)
	}
	return ph
}
