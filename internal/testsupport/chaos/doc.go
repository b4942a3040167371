// Package chaos holds the chaos suite: tests that run the real
// switchboard binary (relay, transceivers, echo agent) and a real
// redis-server as separate processes on loopback, break one part on
// purpose (kill -9 a relay, Redis or a transceiver, impair the network,
// make clients vanish) and check the invariants of docs/design.md §5 while
// many Pion sessions run. Each test logs its figures on lines starting
// with "FIGURE"; docs/reliability.md records them, with the command that
// reproduces them.
//
// The tests build cmd/switchboard once per run with `go build` (no race
// detector, whatever the test binary has). Its `switchboard load`
// (internal/callclient's Load) is the load generator: it runs the client
// sessions in a process of its own, prints a JSON line as each connects
// (-connected-json) and as each ends (-sessions-json), takes SIGUSR1 as
// the moment of a fault, and with -vanish makes clients drop off the
// network unannounced. The impairment proxy of TestImpairedNetwork
// (internal/testsupport/impair) runs as impairproxy, also built without
// the race detector, in a process of its own.
//
// Knobs (go test flags): -chaos.full runs the lengths the docs record
// (3 min impaired network, 500 restart rounds); -chaos.duration and
// -chaos.rounds set them one by one; -chaos.sessions the concurrent
// sessions of each media test.
package chaos
