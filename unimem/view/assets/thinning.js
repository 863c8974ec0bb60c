// The thinning rule of unimem/observe/thinning.py, line for line, for the page's draws: per
// pixel column a line keeps its first, lowest, highest and last point between two gaps, and one
// gap per run of gaps. The Python module is the definition; tests/observe/test_view_browser.py
// holds this mirror to the same points on the same data.
"use strict";

// The first index in xs[lo, hi) whose value is not below x (Python's bisect.bisect_left).
function bisectLeft(xs, x, lo, hi) {
  while (lo < hi) {
    const mid = (lo + hi) >>> 1;
    if (xs[mid] < x) lo = mid + 1;
    else hi = mid;
  }
  return lo;
}

// The first index in xs[lo, hi) whose value is above x (Python's bisect.bisect_right).
function bisectRight(xs, x, lo, hi) {
  while (lo < hi) {
    const mid = (lo + hi) >>> 1;
    if (x < xs[mid]) hi = mid;
    else lo = mid + 1;
  }
  return lo;
}

// thin_line(times[lo:hi], values[lo:hi], buckets): times in order and finite, a NaN value a gap.
// Returns {t, v}: the points kept, in order (NaN for a gap).
function thinLine(times, values, buckets, lo = 0, hi = times.length) {
  const outT = [];
  const outV = [];
  if (hi - lo <= 4 * buckets) {
    for (let i = lo; i < hi; i++) {
      outT.push(times[i]);
      outV.push(values[i]);
    }
    return { t: outT, v: outV };
  }
  const first = times[lo];
  const width = (times[hi - 1] - first) / buckets;
  let start = lo;
  for (let bucket = 1; bucket <= buckets; bucket++) {
    const end = bucket === buckets ? hi : bisectLeft(times, first + bucket * width, start, hi);
    let run = start; // the first point of the run between gaps being read
    let low = -1; // the first lowest and the first highest point of the run, as list.index(min(...))
    let high = -1;
    let lowest = 0;
    let highest = 0;
    for (let i = start; i < end; i++) {
      const y = values[i];
      if (y === y) {
        if (low < 0) {
          low = high = i;
          lowest = highest = y;
        } else if (y < lowest) {
          low = i;
          lowest = y;
        } else if (y > highest) {
          high = i;
          highest = y;
        }
        continue;
      }
      if (i > run) keepRun(times, values, run, low, high, i - 1, outT, outV);
      if (outV.length === 0 || outV[outV.length - 1] === outV[outV.length - 1]) {
        outT.push(times[i]); // a run of gaps is one break
        outV.push(NaN);
      }
      run = i + 1;
      low = -1;
      high = -1;
    }
    if (end > run) keepRun(times, values, run, low, high, end - 1, outT, outV);
    start = end;
  }
  return { t: outT, v: outV };
}

// The points sorted({first, low, high, last}) of one run between gaps (first <= low, high <= last).
function keepRun(times, values, first, low, high, last, outT, outV) {
  const a = Math.min(low, high);
  const b = Math.max(low, high);
  outT.push(times[first]);
  outV.push(values[first]);
  if (a > first) {
    outT.push(times[a]);
    outV.push(values[a]);
  }
  if (b > a) {
    outT.push(times[b]);
    outV.push(values[b]);
  }
  if (last > b) {
    outT.push(times[last]);
    outV.push(values[last]);
  }
}

// spaced(positions, gap): the indices to keep, left to right, so no two kept are closer than gap.
function spaced(positions, gap) {
  const order = [];
  for (let i = 0; i < positions.length; i++) if (Number.isFinite(positions[i])) order.push(i);
  order.sort((a, b) => positions[a] - positions[b] || a - b);
  const kept = [];
  let previous = 0;
  for (const index of order) {
    if (kept.length === 0 || positions[index] - previous >= gap) {
      kept.push(index);
      previous = positions[index];
    }
  }
  return kept;
}
