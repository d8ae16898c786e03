package mesh

import (
	"fmt"
	"log/slog"
	"net"
	"strconv"
	"strings"
	"time"
)

// Defaults of the zero values of Config.
const (
	DefaultStartTimeout = 60 * time.Second
	DefaultPeerTimeout  = 10 * time.Second
	DefaultMaxInFlight  = 32 << 20
	DefaultInboxLimit   = 32 << 20
)

// MaxPayload is the largest payload Send accepts.
const MaxPayload = 1 << 30

// Config sets up one process of a cluster.
type Config struct {
	Index        int                                     // this process's index in Addresses
	Addresses    []string                                // "host:port" of every process, in index order
	Secret       []byte                                  // shared secret; nil/empty allowed only when every address is loopback
	TLS          *TLSFiles                               // nil or all empty: no TLS; else TLS (with a CA file, mutual TLS) between the processes (tls.go)
	Identity     map[string]string                       // what every process must agree on (flow fingerprint, worker count, ...); compared at handshake
	StartTimeout time.Duration                           // all peers connected (both directions) within this; default 60s
	PeerTimeout  time.Duration                           // a peer silent this long is lost; default 10s; heartbeats at PeerTimeout/5 capped at 1s
	MaxInFlight  int64                                   // bytes queued for one peer beyond which Congested() is true; default 32 MiB
	InboxLimit   int64                                   // bytes received from one peer and not yet drained beyond which reading from it pauses; default 32 MiB
	Handlers     map[byte]func(from int, payload []byte) // control kinds (1..255): called on the peer's receive goroutine, in arrival order per peer; must not block long
	Logger       *slog.Logger                            // nil: discard
}

// settings is a validated Config with its defaults filled in and the
// figures derived from it.
type settings struct {
	Config
	listen    string                              // what this process binds
	tls       *tlsSetup                           // nil without TLS
	handlers  [256]func(from int, payload []byte) // Handlers by kind
	heartbeat time.Duration                       // interval of heartbeats and of the silence check
	handshake time.Duration                       // longest wait for one handshake step
	window    int32                               // HTTP/2 stream and connection window
}

// validate checks cfg and fills in its defaults. Every error wraps
// ErrConfig and says what to change.
func validate(cfg Config) (*settings, error) {
	n := len(cfg.Addresses)
	if n == 0 {
		return nil, errorf(ErrConfig, nil, "no process addresses: give at least this process's address")
	}
	if cfg.Index < 0 || cfg.Index >= n {
		return nil, errorf(ErrConfig, nil, "process index %d is out of range for %d addresses (0..%d)", cfg.Index, n, n-1)
	}
	var notLoopback []string
	seen := make(map[string]int, n)
	for i, a := range cfg.Addresses {
		host, port, err := net.SplitHostPort(a)
		if err != nil {
			return nil, errorf(ErrConfig, err, "address %d %q is malformed: %v (want host:port)", i, a, errCause(err))
		}
		if p, err := strconv.Atoi(port); err != nil || p < 1 || p > 65535 {
			return nil, errorf(ErrConfig, nil, "address %d %q is malformed: port %q is not a number from 1 to 65535", i, a, port)
		}
		if host == "" {
			return nil, errorf(ErrConfig, nil, "address %d %q is malformed: it has no host (the other processes dial it)", i, a)
		}
		key := strings.ToLower(a)
		if j, dup := seen[key]; dup {
			return nil, errorf(ErrConfig, nil, "processes %d and %d have the same address %s", j, i, a)
		}
		seen[key] = i
		if !isLoopback(host) {
			notLoopback = append(notLoopback, a)
		}
	}
	if len(cfg.Secret) == 0 && len(notLoopback) > 0 {
		if len(notLoopback) == 1 {
			return nil, errorf(ErrConfig, nil, "address %s is not loopback: set a cluster secret (MILLPOND_CLUSTER_SECRET)", notLoopback[0])
		}
		return nil, errorf(ErrConfig, nil, "addresses %s are not loopback: set a cluster secret (MILLPOND_CLUSTER_SECRET)", strings.Join(notLoopback, ", "))
	}
	for name, d := range map[string]time.Duration{"StartTimeout": cfg.StartTimeout, "PeerTimeout": cfg.PeerTimeout} {
		if d < 0 {
			return nil, errorf(ErrConfig, nil, "%s is negative (%s): use 0 for the default", name, d)
		}
	}
	for name, v := range map[string]int64{"MaxInFlight": cfg.MaxInFlight, "InboxLimit": cfg.InboxLimit} {
		if v < 0 {
			return nil, errorf(ErrConfig, nil, "%s is negative (%d): use 0 for the default", name, v)
		}
	}
	s := &settings{Config: cfg}
	if cfg.TLS.enabled() {
		f := *cfg.TLS
		base, err := LoadTLS(f.CertFile, f.KeyFile, f.CAFile)
		if err != nil {
			return nil, err
		}
		if n > 1 {
			if err := checkHost(f.CertFile, base.Certificates[0].Leaf, cfg.Addresses[cfg.Index]); err != nil {
				return nil, err
			}
		}
		s.tls = &tlsSetup{base: base, withCA: f.CAFile != ""}
		s.TLS = &f
	} else {
		s.TLS = nil
	}
	for kind, h := range cfg.Handlers {
		if kind == 0 {
			return nil, errorf(ErrConfig, nil, "a handler for kind 0: kind 0 is data (Drain returns it); control kinds are 1..255")
		}
		if h == nil {
			return nil, errorf(ErrConfig, nil, "the handler for control kind %d is nil", kind)
		}
		s.handlers[kind] = h
	}
	s.Addresses = append([]string(nil), cfg.Addresses...)
	s.Secret = append([]byte(nil), cfg.Secret...)
	s.Identity = make(map[string]string, len(cfg.Identity))
	for k, v := range cfg.Identity {
		s.Identity[k] = v
	}
	s.Handlers = nil
	if s.StartTimeout == 0 {
		s.StartTimeout = DefaultStartTimeout
	}
	if s.PeerTimeout == 0 {
		s.PeerTimeout = DefaultPeerTimeout
	}
	if s.MaxInFlight == 0 {
		s.MaxInFlight = DefaultMaxInFlight
	}
	if s.InboxLimit == 0 {
		s.InboxLimit = DefaultInboxLimit
	}
	if s.Logger == nil {
		s.Logger = slog.New(slog.DiscardHandler)
	}
	s.heartbeat = min(s.PeerTimeout/5, time.Second)
	s.handshake = max(s.PeerTimeout, 5*time.Second)
	s.window = int32(min(max(s.InboxLimit, 64<<10), 4<<20))
	host, port, _ := net.SplitHostPort(cfg.Addresses[cfg.Index])
	s.listen = cfg.Addresses[cfg.Index]
	if !isLoopback(host) {
		// A StatefulSet pod's own DNS name may not resolve before the pod
		// is ready, and its address is the pod's anyway: listen on every
		// interface at the port. Peers authenticate with the secret.
		s.listen = net.JoinHostPort("", port)
	}
	return s, nil
}

// isLoopback reports whether host is "localhost" or a loopback IP.
func isLoopback(host string) bool {
	if strings.EqualFold(host, "localhost") {
		return true
	}
	if i := strings.IndexByte(host, '%'); i >= 0 {
		host = host[:i] // zone of an IPv6 address
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// errCause returns the innermost message of a net.AddrError and the like,
// without the address repeated.
func errCause(err error) string {
	if ae, ok := err.(*net.AddrError); ok {
		return ae.Err
	}
	return err.Error()
}

// formatDuration writes whole seconds as "60s" (not "1m0s"), anything
// else to the millisecond.
func formatDuration(d time.Duration) string {
	d = d.Round(time.Millisecond)
	if d >= time.Second && d%time.Second == 0 {
		return fmt.Sprintf("%ds", d/time.Second)
	}
	return d.String()
}
