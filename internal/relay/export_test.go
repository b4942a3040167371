package relay

// pendingOf returns the pending count of client k's source slot.
func (l *limiter) pendingOf(k addrKey) int { return int(l.slotOf(&k).Load() & limField) }
