package mesh

import (
	"fmt"
	"time"
)

// watch fails the mesh when a peer has been silent for PeerTimeout. Every
// process sends a heartbeat every PeerTimeout/5 (at most every second) on
// the return direction of each stream it serves, from a goroutine of its
// own: the caller, the GIL and a full inbox do not delay it, and nothing
// queues ahead of it (that direction carries nothing else). A process
// that is stopped (SIGSTOP), hung in the kernel or cut off sends none.
func (m *Mesh) watch() {
	defer m.wg.Done()
	t := time.NewTicker(m.s.heartbeat)
	defer t.Stop()
	for {
		select {
		case <-m.ctx.Done():
			return
		case now := <-t.C:
			if !m.live() {
				continue
			}
			for _, p := range m.remote() {
				m.mu.Lock()
				up := p.outUp
				m.mu.Unlock()
				if !up || p.left.Load() {
					continue
				}
				if p.silentFor(now) > m.s.PeerTimeout {
					p.ended(fmt.Sprintf("silent for more than %s (no heartbeat: the process is hung, stopped or cut off)", formatDuration(m.s.PeerTimeout)))
				}
			}
		}
	}
}
