package trxbench

import (
	"bufio"
	"math"
	"slices"
	"strconv"
	"strings"
)

// metrics is one scrape of a Prometheus text endpoint: each sample line's
// name{labels} to its value.
type metrics map[string]float64

func scrape(addr string) (metrics, error) {
	resp, err := httpc.Get("http://" + addr + "/metrics")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	m := metrics{}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || line[0] == '#' {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		if i < 0 {
			continue
		}
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err != nil {
			continue
		}
		m[line[:i]] = v
	}
	return m, sc.Err()
}

// value returns the sample name with label direction=dir ("" for none).
func (m metrics) value(name, dir string) float64 {
	if dir == "" {
		return m[name]
	}
	return m[name+`{direction="`+dir+`"}`]
}

// bucket is a cumulative histogram bucket.
type bucket struct {
	le    float64
	count float64
}

// buckets returns the cumulative buckets of histogram name with label
// direction=dir, by rising bound.
func (m metrics) buckets(name, dir string) []bucket {
	prefix := name + `_bucket{direction="` + dir + `",le="`
	var bs []bucket
	for k, v := range m {
		rest, ok := strings.CutPrefix(k, prefix)
		if !ok {
			continue
		}
		le, err := strconv.ParseFloat(strings.TrimSuffix(rest, `"}`), 64)
		if err != nil {
			continue
		}
		bs = append(bs, bucket{le, v})
	}
	slices.SortFunc(bs, func(a, b bucket) int {
		switch {
		case a.le < b.le:
			return -1
		case a.le > b.le:
			return 1
		}
		return 0
	})
	return bs
}

// quantileDiff returns quantile q of the observations made between two
// scrapes of one histogram, interpolating linearly within the bucket as
// Prometheus's histogram_quantile does; NaN when there were none.
func quantileDiff(before, after []bucket, q float64) float64 {
	if len(after) == 0 || len(before) != len(after) {
		return math.NaN()
	}
	d := make([]bucket, len(after))
	for i := range after {
		d[i] = bucket{after[i].le, after[i].count - before[i].count}
	}
	total := d[len(d)-1].count
	if total <= 0 {
		return math.NaN()
	}
	rank := q * total
	lower, below := 0.0, 0.0
	for _, b := range d {
		if b.count >= rank {
			if math.IsInf(b.le, 1) {
				return lower // beyond the last finite bound
			}
			in := b.count - below
			if in <= 0 {
				return b.le
			}
			return lower + (b.le-lower)*(rank-below)/in
		}
		lower, below = b.le, b.count
	}
	return lower
}
