package group

// SetStripes sets the group's place among the router replicas
// (routing.Router.SetStripes): routers replicas, this one index-th. It
// holds while the index is rebuilt for a new block size. Errors as
// routing.Router.SetStripes (nothing changed). Safe for concurrent use.
func (b *Backend) SetStripes(routers, index int) error {
	b.mu.Lock() // a rebuild copies cfg.Routing under mu
	defer b.mu.Unlock()
	if err := b.cur.Load().router.SetStripes(routers, index); err != nil {
		return err
	}
	b.cfg.Routing.Routers, b.cfg.Routing.RouterIndex = routers, index
	return nil
}

// Stripes returns the group's router's place among the router replicas
// (routing.Router.Stripes).
func (b *Backend) Stripes() (routers, index int) { return b.cur.Load().router.Stripes() }
