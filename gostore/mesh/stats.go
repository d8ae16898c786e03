package mesh

import "time"

// PeerStats are one peer's transport figures. Frames and bytes count
// payloads (data and control frames, not heartbeats or framing).
type PeerStats struct {
	Peer    int
	Address string
	// FramesOut and BytesOut: frames handed to the stream to the peer.
	// FramesIn and BytesIn: frames read from the peer's stream (drained or
	// not). For the entry of this process itself: frames it sent itself.
	FramesOut, FramesIn, BytesOut, BytesIn int64
	// BlockedSeconds is the total time the outbound queue for this peer
	// held more than MaxInFlight bytes: the time Congested() was true on
	// this peer's account, because the stream (HTTP/2 flow control, the
	// network, a peer that does not drain) took frames slower than Send
	// queued them.
	BlockedSeconds float64
	// Queued is the payload bytes accepted by Send and not yet handed to
	// the stream. Queued + BytesOut is every byte Send accepted for the
	// peer (until frames are dropped because the peer left).
	Queued int64
	// Left is true once the peer said goodbye (closed its mesh).
	Left bool
}

// Stats returns every process's figures, by index (this process's own
// entry included).
func (m *Mesh) Stats() []PeerStats {
	now := time.Now()
	out := make([]PeerStats, m.n)
	for i, p := range m.peers {
		o := &p.out
		o.mu.Lock()
		blocked := o.blocked
		if o.congested {
			blocked += now.Sub(o.since)
		}
		out[i] = PeerStats{
			Peer:           i,
			Address:        p.addr,
			FramesOut:      o.framesOut,
			BytesOut:       o.bytesOut,
			BlockedSeconds: blocked.Seconds(),
			Queued:         o.queued,
		}
		o.mu.Unlock()
		out[i].FramesIn = p.framesIn.Load()
		out[i].BytesIn = p.bytesIn.Load()
		out[i].Left = p.left.Load()
	}
	return out
}
