package playout

// active returns how many queues are playing on the worker.
func (w *worker) active() int { return len(w.queues) }
