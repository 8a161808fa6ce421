//go:build !linux

package gateway

// Elsewhere an idle connection keeps its reader goroutine.
const canPark = false

type idler struct{}

func newIdler(*Transport) *idler { return &idler{} }
func (*idler) park(*conn) bool   { return false }
func (*idler) wake(*conn)        {}
func (*idler) close()            {}
func (*idler) parkedCount() int  { return 0 }
