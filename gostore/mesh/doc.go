// Package mesh is the process-to-process transport of a millpond cluster.
//
// A flow runs as n processes; Addresses[i] is process i's "host:port".
// Every process listens on its own address and dials every other one:
// for each ordered pair (i, j) there is one gRPC stream, dialed by i and
// served by j, that carries i's frames to j in order. The direction back
// carries only j's handshake answers, heartbeats and goodbye. gRPC brings
// HTTP/2 flow control, keepalive pings and deadlines; the messages are raw
// bytes (a hand-written codec and service description, no protoc).
//
// A process whose own address is a loopback one listens on exactly that
// address; any other process listens on every interface at its port (a
// StatefulSet pod's DNS name may not resolve before the pod is ready),
// and then a cluster secret is required. With one process there is no
// network at all.
//
// # Frames
//
// Send(to, kind, payload) queues a frame: kind 0 is data, which the
// receiver's Drain returns; kinds 1..255 are control frames, which the
// receiver hands to Config.Handlers[kind] on that peer's receive
// goroutine. Data and control frames from one process to another share
// one FIFO queue and one stream, so they arrive in the order they were
// sent: what barrier alignment (a marker after a channel's data) needs.
//
// # Why it cannot deadlock
//
// Every process may send to every other at once while every inbox is
// full, and still everything arrives, because no wait is on the caller:
//
//   - Send never blocks. It appends to the peer's unbounded queue and
//     returns; a sender goroutine per peer moves the queue into the
//     stream. Only that goroutine ever waits for the network.
//   - The receive goroutine of a peer waits only for this process's Drain
//     (when that peer's undrained bytes exceed InboxLimit), never for
//     anything it would send. While it waits, HTTP/2 flow control stops
//     the peer's sender goroutine, whose queue grows until Congested()
//     turns true over there: the back-pressure signal, on which the
//     engine stops reading its sources, not its inbox.
//   - The caller's loop always drains (Drain, Wait) whatever it does
//     with its sources, so every paused receive goroutine resumes.
//
// So a wait chain is always sender goroutine → peer's receive goroutine →
// peer's caller, and the caller waits on no one: there is no cycle. What
// grows under all-to-all pressure is the outbound queues, bounded in
// practice because Congested() stops the sources that feed them. The test
// TestAllToAllUnderPressure runs four processes sending 256 KiB frames to
// each other with 64 KiB limits.
//
// # Handshake and authentication
//
// Before any frame, every stream runs a mutual HMAC-SHA256 challenge and
// response over the shared secret (handshake.go): the client's hello
// carries the protocol version, both indices, the process count, a fresh
// nonce and its Identity; the server answers with its own nonce, Identity
// and a MAC over the whole exchange; the client checks that MAC, the
// server's index, the count and the Identity, and only then proves its
// own knowledge of the secret; the server checks that proof and its
// claims before it accepts. A process with the wrong secret gets nothing
// but a challenge, and the server delivers nothing from an unproven
// client. The handshake authenticates; it does not encrypt: without TLS
// frames travel in clear text. Without a secret every address must be
// loopback.
//
// # TLS
//
// Config.TLS (tls.go) adds TLS 1.3 under the handshake, which then runs
// inside it unchanged. With a certificate and key every server presents
// the certificate and every client checks it for the host of the peer's
// address; with a CA file both ends check against that CA only and the
// servers require a client certificate signed by it (mutual TLS). The
// files are loaded and checked at Start (ErrConfig, naming the file),
// including that the certificate is valid for this process's own host
// and, with a CA, signed by it for both server and client use. A server
// tells a plain-text peer from a TLS one by the connection's first byte:
// a peer of the other kind, or one that fails the TLS handshake, is
// refused before any byte of the protocol crosses, with one log line
// naming its address and why (refusedConnection); it gets a TLS alert or
// an empty HTTP/2 SETTINGS frame, so that a millpond peer names the
// mismatch (ErrTLSMismatch) instead of calling it a foreign protocol. A
// client that cannot verify the server, or whose certificate the server
// refuses, fails its Start at once (ErrAuthentication).
//
// # Failure
//
// A broken stream, or a peer silent for PeerTimeout (heartbeats every
// PeerTimeout/5, at most every second, sent by a goroutine of their own),
// stops the mesh with one *PeerLostError: Done closes, Err returns it and
// Wait returns. A peer that closed its mesh says goodbye first and is not
// lost. Like Bytewax and Flink, a cluster does not heal: it stops as a
// whole and is restarted from the last committed epoch.
//
// # Files
//
// config.go (Config, validation, defaults), mesh.go (the Mesh and its
// calls: Send, Counts, Err...), start.go (Start: listening, joining, its
// errors), stop.go (failure, Abort, Close), peer.go (one peer: its
// streams' ends, goodbye, loss), outbox.go (the send queue and its
// goroutine), inbox.go (the receive side: Drain, Wait, InboxLimit),
// server.go (the service and the served half of a stream), dial.go
// (dialing with retries, telling a foreign protocol), handshake.go,
// tls.go (TLS files, credentials, refusals), codec.go, frame.go,
// liveness.go (heartbeat silence), stats.go, errors.go.
package mesh
