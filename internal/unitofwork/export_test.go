package unitofwork

// Queued returns how many commands wait behind a commit in flight.
func Queued(u *UnitOfWork) int {
	if u.group == nil {
		return 0
	}
	u.group.mu.Lock()
	defer u.group.mu.Unlock()
	n := 0
	for _, g := range u.group.groups {
		n += len(g.queue)
	}
	return n
}
