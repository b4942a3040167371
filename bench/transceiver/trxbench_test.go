package trxbench

import (
	"context"
	"errors"
	"math"
	"testing"
)

func TestParseStat(t *testing.T) {
	// A command name with spaces and parentheses, as proc(5) allows.
	line := "4242 (switch (board) x) S 1 2 3 4 5 6 7 8 9 10 170 30 0 0 20 0 12 0 99 1000 50"
	got, err := parseStat(line)
	if err != nil || got != 200 {
		t.Fatalf("parseStat = %d, %v; want 200", got, err)
	}
	if _, err := parseStat("4242 (x) S 1"); err == nil {
		t.Fatal("short line accepted")
	}
}

func TestQuantileDiff(t *testing.T) {
	inf := math.Inf(1)
	before := []bucket{{0.001, 10}, {0.002, 10}, {0.004, 10}, {inf, 10}}
	// 100 new observations: 50 at or below 1 ms, 40 in (1, 2] ms, 10 in (2, 4] ms.
	after := []bucket{{0.001, 60}, {0.002, 100}, {0.004, 110}, {inf, 110}}
	if got := quantileDiff(before, after, 0.5); math.Abs(got-0.001) > 1e-12 {
		t.Errorf("p50 = %v, want 0.001", got)
	}
	if got := quantileDiff(before, after, 0.7); math.Abs(got-0.0015) > 1e-12 {
		t.Errorf("p70 = %v, want 0.0015 (halfway through the second bucket)", got)
	}
	if got := quantileDiff(before, after, 0.99); math.Abs(got-0.0038) > 1e-12 {
		t.Errorf("p99 = %v, want 0.0038", got)
	}
	if got := quantileDiff(before, before, 0.5); !math.IsNaN(got) {
		t.Errorf("no observations: %v, want NaN", got)
	}
}

func TestRatios(t *testing.T) {
	// Two runs of two steps; the second run of the PCM format stopped
	// after its first step; its first run carried only half of N = 20.
	opus := [][]sample{{{n: 10, carried: 10, trxCores: 0.1}, {n: 20, carried: 20, trxCores: 0.2}}, {{n: 10, carried: 10, trxCores: 0.2}, {n: 20, carried: 20, trxCores: 0.4}}}
	pcm := [][]sample{{{n: 10, carried: 10, trxCores: 0.3}, {n: 20, carried: 10, trxCores: 0.5}}, {{n: 10, carried: 10, trxCores: 0.4}}}
	got := ratios([]int{10, 20}, opus, pcm)
	want := []Ratio{{N: 10, Ratio: 2.5, Runs: 2}, {N: 20, Ratio: 5, Runs: 1}} // median of 3 and 2; (0.5/10)/(0.2/20)
	if len(got) != len(want) {
		t.Fatalf("ratios = %+v, want %+v", got, want)
	}
	for i := range want {
		if got[i].N != want[i].N || got[i].Runs != want[i].Runs || math.Abs(got[i].Ratio-want[i].Ratio) > 1e-9 {
			t.Errorf("ratios[%d] = %+v, want %+v", i, got[i], want[i])
		}
	}
}

func TestRunRejectsFormats(t *testing.T) {
	for _, formats := range [][]string{{"pcm16/8000/1"}, {"opus/48000/2", "opus/48000/2"}} {
		if _, err := Run(context.Background(), Options{Bin: "unused", Formats: formats}); !errors.Is(err, ErrOptions) {
			t.Errorf("formats %q: err %v, want ErrOptions", formats, err)
		}
	}
}
