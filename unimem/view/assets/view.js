// unimem view: the page's drawing. The data (unimem/view/page.py) is a manifest (JSON) and one
// block of float64 arrays; each draw thins the samples in view to the canvas's pixel columns
// (thinning.js, the PNG's rule) and draws them on a 2D canvas. performance.mark("drawn") is set
// when the first draw ends; window.unimemView holds the state a test or a benchmark reads.
(() => {
  // Each figure's colour and dash, the same in every lane (matplotlib's default cycle).
  const STYLE = {
    allocated: ["#1f77b4", []],
    reserved: ["#ff7f0e", []],
    peak: ["#2ca02c", [2, 3]],
    process_used: ["#d62728", []],
    device_used: ["#9467bd", [6, 4]],
    device_total: ["#7f7f7f", [1, 3]],
    host_rss: ["#8c564b", []],
    host_peak: ["#e377c2", [2, 3]],
  };
  const PALETTE = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f"];
  const MARK_COLOUR = "#555555";
  const GAP_COLOUR = "rgba(255, 140, 0, 0.6)";
  const PAD = { left: 72, right: 14, top: 14, bottom: 26 }; // CSS pixels around a lane's plot
  const LABEL_ROOM = 14; // CSS pixels between two labelled marks: their upright labels stay readable
  const LABEL_CHARS = 120; // of a mark's label drawn upright: more would not fit any canvas's height
  const MAX_TICKS = 1000; // grid lines of one axis: far more than any canvas shows
  const NEAR = 6; // CSS pixels within which the pointer is on a mark or a failed reading
  const UNITS = [
    [2 ** 30, "GiB"],
    [2 ** 20, "MiB"],
    [2 ** 10, "KiB"],
  ];

  const view = {
    ready: false,
    error: null,
    draws: 0,
    lastDraw: null,
    x0: 0,
    x1: 1,
    extent: [0, 1],
    lanes: [],
    drawn: [],
    charts: [],
    timings: {},
    styles: STYLE,
    thinLine,
    spaced,
    formatBytes,
  };
  window.unimemView = view;
  const manifest = JSON.parse(document.getElementById("unimem-manifest").textContent);
  const tooltip = document.getElementById("tooltip");
  let pending = false;

  main().catch((error) => {
    view.error = String((error && error.stack) || error);
    const failure = document.getElementById("failure");
    failure.textContent = `This page could not be drawn: ${error}`;
    failure.hidden = false;
    console.error(error);
  });

  async function main() {
    const values = await decode(document.getElementById("unimem-data").textContent.trim());
    view.timings.decoded = performance.now();
    const arrays = manifest.arrays.map(([start, length]) => values.subarray(start, start + length));
    setUp(arrays);
    view.timings.laid = performance.now();
    draw();
    for (const comparison of manifest.comparisons) showComparison(comparison);
    performance.mark("drawn");
    view.ready = true;
    window.addEventListener("resize", schedule);
  }

  // The arrays: base64 of deflated, byte-shuffled float64 (the platform's order: little-endian).
  async function decode(text) {
    view.timings.started = performance.now();
    const packed = typeof Uint8Array.fromBase64 === "function" ? Uint8Array.fromBase64(text) : fromBase64(text);
    const stream = new Blob([packed]).stream().pipeThrough(new DecompressionStream("deflate"));
    const shuffled = new Uint8Array(await new Response(stream).arrayBuffer());
    view.timings.inflated = performance.now();
    const count = shuffled.length / 8;
    // Each value's eight bytes, one from each eighth, as the two 32-bit words of a float64.
    const words = new Uint32Array(count * 2);
    const [b0, b1, b2, b3, b4, b5, b6, b7] = [0, 1, 2, 3, 4, 5, 6, 7].map((k) => k * count);
    for (let i = 0; i < count; i++) {
      const s = shuffled;
      words[2 * i] = s[b0 + i] | (s[b1 + i] << 8) | (s[b2 + i] << 16) | (s[b3 + i] << 24);
      words[2 * i + 1] = s[b4 + i] | (s[b5 + i] << 8) | (s[b6 + i] << 16) | (s[b7 + i] << 24);
    }
    return new Float64Array(words.buffer);
  }

  function fromBase64(text) {
    const binary = atob(text);
    const bytes = new Uint8Array(binary.length);
    for (let i = 0; i < binary.length; i++) bytes[i] = binary.charCodeAt(i);
    return bytes;
  }

  // --- the lanes -------------------------------------------------------------------------------

  function setUp(arrays) {
    const origin = manifest.origin;
    const relative = new Map(); // each time array once, as seconds since the origin
    const timesOf = (index) => {
      if (!relative.has(index)) {
        const times = arrays[index];
        const since = new Float64Array(times.length);
        for (let i = 0; i < times.length; i++) since[i] = times[i] - origin;
        relative.set(index, since);
      }
      return relative.get(index);
    };
    let low = Infinity;
    let high = -Infinity;
    const stretch = (times) => {
      if (times.length) {
        low = Math.min(low, times[0]);
        high = Math.max(high, times[times.length - 1]);
      }
    };
    for (const spec of manifest.lanes) {
      const lines = spec.lines.map((line) => ({ ...line, times: timesOf(line.t), values: arrays[line.v] }));
      const marks = spec.marks.map(([time, label, allocated, reserved]) => ({
        t: time - origin,
        label,
        allocated,
        reserved,
      }));
      const lane = {
        spec,
        lines,
        marks,
        markTimes: Float64Array.from(marks, (mark) => mark.t),
        gapTimes: Float64Array.from(spec.gaps, ([time]) => time - origin),
        show: { marks: true, gaps: true, cap: true },
        last: null,
      };
      lines.forEach((line) => stretch(line.times));
      stretch(lane.markTimes);
      stretch(lane.gapTimes);
      view.lanes.push(lane);
      buildLane(lane);
    }
    if (!(low <= high)) [low, high] = [0, 1];
    if (low === high) [low, high] = [low - 0.5, high + 0.5];
    view.extent = [low, high];
    [view.x0, view.x1] = view.extent;
    const subtitle = [];
    const samples = manifest.lanes.reduce((sum, lane) => sum + lane.samples, 0);
    if (manifest.lanes.length) {
      subtitle.push(`time: seconds since ${new Date(origin * 1000).toISOString().replace("T", " ").slice(0, 19)} UTC`);
      subtitle.push(`${counted(manifest.lanes.length, "recording")}, ${counted(samples, "sample")}`);
    }
    if (manifest.comparisons.length) subtitle.push(counted(manifest.comparisons.length, "comparison"));
    document.getElementById("subtitle").textContent = subtitle.join(" · ");
    document.getElementById("help").hidden = manifest.lanes.length === 0;
    fillList(document.getElementById("notes"), manifest.notes);
  }

  function buildLane(lane) {
    const { spec } = lane;
    const section = element("section", { class: "lane" });
    section.append(element("h2", {}, spec.label));
    const about = [spec.about, counted(spec.samples, "sample"), counted(spec.marks.length, "mark")];
    if (spec.file) about.push(spec.file);
    section.append(element("p", { class: "about" }, about.join(" · ")));
    section.append(fillList(element("ul", { class: "notes" }), spec.notes));
    const legend = element("ul", { class: "legend" });
    for (const line of lane.lines) {
      const [colour, dash] = STYLE[line.figure] || ["#000", []];
      const title = counted(line.known, "reading");
      legend.append(toggle(line.label, swatch(colour, dash), title, line.shown, (on) => (line.shown = on)));
    }
    if (spec.limit !== null) {
      const label = `cap ${formatBytes(spec.limit)}`;
      legend.append(toggle(label, swatch("#000", [8, 3, 2, 3]), "the recording's cap", true, (on) => (lane.show.cap = on)));
    }
    if (spec.marks.length) {
      legend.append(toggle(counted(spec.marks.length, "mark"), swatch(MARK_COLOUR, [1, 2]), "", true, (on) => (lane.show.marks = on)));
    }
    if (spec.gaps.length) {
      const label = counted(spec.gaps.length, "failed reading");
      legend.append(toggle(label, swatch(GAP_COLOUR, []), "gaps in the data", true, (on) => (lane.show.gaps = on)));
    }
    section.append(legend);
    const plot = element("div", { class: "plot", tabindex: "0", "aria-label": `${spec.label}: memory over time` });
    lane.canvas = element("canvas", { class: "timeline" });
    lane.overlay = element("canvas", { class: "overlay" });
    plot.append(lane.canvas, lane.overlay);
    section.append(plot);
    document.getElementById("lanes").append(section);
    listen(lane, plot);
  }

  function toggle(label, mark, title, on, set) {
    const button = element("button", { type: "button", "aria-pressed": String(on), title });
    button.append(mark, document.createTextNode(label));
    button.addEventListener("click", () => {
      const next = button.getAttribute("aria-pressed") !== "true";
      button.setAttribute("aria-pressed", String(next));
      set(next);
      schedule();
    });
    const item = element("li");
    item.append(button);
    return item;
  }

  function swatch(colour, dash) {
    const span = element("span", { class: "swatch" });
    span.style.borderTopColor = colour;
    if (dash.length) span.style.borderTopStyle = "dashed";
    return span;
  }

  // --- drawing ---------------------------------------------------------------------------------

  function schedule() {
    if (pending) return;
    pending = true;
    requestAnimationFrame(() => {
      pending = false;
      draw();
    });
  }

  function draw() {
    const start = performance.now();
    view.drawn = [];
    for (const lane of view.lanes) drawLane(lane);
    view.draws += 1;
    view.lastDraw = { start, end: performance.now(), x0: view.x0, x1: view.x1 };
  }

  function fit(canvas) {
    const ratio = window.devicePixelRatio || 1;
    const width = canvas.clientWidth;
    const height = canvas.clientHeight;
    if (canvas.width !== Math.round(width * ratio) || canvas.height !== Math.round(height * ratio)) {
      canvas.width = Math.round(width * ratio);
      canvas.height = Math.round(height * ratio);
    }
    const ctx = canvas.getContext("2d");
    ctx.setTransform(ratio, 0, 0, ratio, 0, 0);
    ctx.clearRect(0, 0, width, height);
    return { ctx, width, height, ratio };
  }

  function drawLane(lane) {
    const { ctx, width, height, ratio } = fit(lane.canvas);
    fit(lane.overlay);
    const plot = { left: PAD.left, right: Math.max(PAD.left + 1, width - PAD.right), top: PAD.top, bottom: height - PAD.bottom };
    const columns = Math.max(1, Math.round((plot.right - plot.left) * ratio));
    const thinned = [];
    let top = 0;
    for (const line of lane.lines) {
      if (!line.shown) continue;
      const count = line.times.length;
      const lo = Math.max(0, bisectLeft(line.times, view.x0, 0, count) - 1); // one point beyond each edge:
      const hi = Math.min(count, bisectRight(line.times, view.x1, lo, count) + 1); // the line reaches the frame
      const points = thinLine(line.times, line.values, columns, lo, hi);
      for (const value of points.v) if (value > top) top = value;
      thinned.push({ line, points });
      view.drawn.push({ lane: lane.spec.label, figure: line.figure, points: points.t.length, inView: hi - lo });
    }
    const cap = lane.show.cap ? lane.spec.limit : null;
    if (cap !== null) top = Math.max(top, cap);
    const [scale, unit] = unitOf(top);
    const yMax = top > 0 ? top * 1.12 : scale; // headroom: a flat line must not sit on the frame
    const x = (time) => plot.left + ((time - view.x0) / (view.x1 - view.x0)) * (plot.right - plot.left);
    const y = (value) => plot.bottom - (value / yMax) * (plot.bottom - plot.top);
    lane.last = { plot, x };
    axes(ctx, plot, yMax, scale, unit);
    ctx.save();
    ctx.beginPath();
    ctx.rect(plot.left, plot.top, plot.right - plot.left, plot.bottom - plot.top);
    ctx.clip();
    if (lane.show.gaps) verticals(ctx, lane.gapTimes, x, plot.top, plot.bottom, GAP_COLOUR, []);
    for (const { line, points } of thinned) path(ctx, line, points, x, y);
    if (cap !== null) {
      ctx.strokeStyle = "#000";
      ctx.setLineDash([8, 3, 2, 3]);
      ctx.lineWidth = 1;
      ctx.beginPath();
      ctx.moveTo(plot.left, y(cap));
      ctx.lineTo(plot.right, y(cap));
      ctx.stroke();
    }
    ctx.restore();
    if (lane.show.marks) drawMarks(ctx, lane, x, plot);
    if (!thinned.length && !lane.marks.length) {
      ctx.fillStyle = "#777";
      ctx.textAlign = "center";
      ctx.fillText(lane.lines.length ? "every figure is hidden" : "no figures known", (plot.left + plot.right) / 2, (plot.top + plot.bottom) / 2);
    }
  }

  function path(ctx, line, points, x, y) {
    const [colour, dash] = STYLE[line.figure] || ["#000", []];
    ctx.strokeStyle = colour;
    ctx.setLineDash(dash);
    ctx.lineWidth = 1.3;
    ctx.beginPath();
    let down = false;
    for (let i = 0; i < points.t.length; i++) {
      const value = points.v[i];
      if (value !== value) {
        down = false; // a failed reading: the line breaks
        continue;
      }
      const px = x(points.t[i]);
      const py = y(value);
      if (down) ctx.lineTo(px, py);
      else ctx.moveTo(px, py);
      down = true;
    }
    ctx.stroke();
  }

  function axes(ctx, plot, yMax, scale, unit) {
    ctx.font = "11px system-ui, sans-serif";
    ctx.fillStyle = "#333";
    ctx.strokeStyle = "#e4e4e4";
    ctx.lineWidth = 1;
    ctx.setLineDash([]);
    const yStep = niceStep(yMax / scale / 5);
    ctx.textAlign = "right";
    ctx.textBaseline = "middle";
    for (const value of ticks(0, yMax / scale + 1e-9, yStep)) {
      const py = plot.bottom - ((value * scale) / yMax) * (plot.bottom - plot.top);
      line(ctx, plot.left, py, plot.right, py);
      ctx.fillText(`${trim(value, yStep)} ${unit}`, plot.left - 6, py);
    }
    const span = view.x1 - view.x0;
    const xStep = niceStep(span / Math.max(2, (plot.right - plot.left) / 110));
    ctx.textAlign = "center";
    ctx.textBaseline = "top";
    for (const time of ticks(Math.ceil(view.x0 / xStep) * xStep, view.x1, xStep)) {
      const px = plot.left + ((time - view.x0) / span) * (plot.right - plot.left);
      line(ctx, px, plot.top, px, plot.bottom);
      ctx.fillText(`${trim(time, xStep)} s`, px, plot.bottom + 6);
    }
    ctx.strokeStyle = "#888";
    ctx.strokeRect(plot.left, plot.top, plot.right - plot.left, plot.bottom - plot.top);
  }

  function line(ctx, x0, y0, x1, y1) {
    ctx.beginPath();
    ctx.moveTo(x0, y0);
    ctx.lineTo(x1, y1);
    ctx.stroke();
  }

  // Vertical lines from ``from`` to ``to`` at the times in view, one per pixel column (more would
  // draw the same image); the first index in view and each line's x.
  function verticals(ctx, times, x, from, to, colour, dash) {
    const lo = bisectLeft(times, view.x0, 0, times.length);
    const hi = bisectRight(times, view.x1, lo, times.length);
    const xs = Array.from(times.subarray(lo, hi), x);
    ctx.strokeStyle = colour;
    ctx.setLineDash(dash);
    ctx.lineWidth = 1;
    ctx.beginPath();
    for (const index of spaced(xs, 1)) {
      ctx.moveTo(xs[index], from);
      ctx.lineTo(xs[index], to);
    }
    ctx.stroke();
    return { lo, xs };
  }

  // Every mark in view a tick along the top; those whose labels fit side by side (as the PNG
  // chooses them) a dotted line with the label upright beside it.
  function drawMarks(ctx, lane, x, plot) {
    const { lo, xs } = verticals(ctx, lane.markTimes, x, plot.top - 6, plot.top, MARK_COLOUR, []);
    const labelled = spaced(xs, LABEL_ROOM);
    ctx.save();
    ctx.beginPath();
    ctx.rect(plot.left, plot.top, plot.right - plot.left, plot.bottom - plot.top);
    ctx.clip();
    ctx.strokeStyle = MARK_COLOUR;
    ctx.setLineDash([1, 2]);
    ctx.beginPath();
    for (const index of labelled) {
      ctx.moveTo(xs[index], plot.top);
      ctx.lineTo(xs[index], plot.bottom);
    }
    ctx.stroke();
    ctx.font = "10px system-ui, sans-serif";
    ctx.fillStyle = MARK_COLOUR;
    ctx.textAlign = "right";
    ctx.textBaseline = "top";
    for (const index of labelled) {
      ctx.save();
      ctx.translate(xs[index] + 2, plot.top + 2);
      ctx.rotate(-Math.PI / 2);
      ctx.fillText(lane.marks[lo + index].label.slice(0, LABEL_CHARS), 0, 0);
      ctx.restore();
    }
    ctx.restore();
  }

  // --- the pointer and the keys ----------------------------------------------------------------

  function listen(lane, plot) {
    let drag = null;
    plot.addEventListener("wheel", (event) => {
      event.preventDefault();
      const steps = event.deltaMode === 1 ? event.deltaY * 33 : event.deltaMode === 2 ? event.deltaY * 400 : event.deltaY;
      zoom(timeAt(lane, event.clientX), Math.exp(steps * 0.002));
    }, { passive: false });
    plot.addEventListener("pointerdown", (event) => {
      drag = { from: event.clientX, x0: view.x0, x1: view.x1 };
      plot.setPointerCapture(event.pointerId);
    });
    plot.addEventListener("pointermove", (event) => {
      if (drag && event.buttons) {
        const { plot: area } = lane.last;
        const shift = ((event.clientX - drag.from) / (area.right - area.left)) * (drag.x1 - drag.x0);
        place(drag.x0 - shift, drag.x1 - shift);
        return;
      }
      hover(lane, event);
    });
    plot.addEventListener("pointerup", () => (drag = null));
    plot.addEventListener("pointerleave", () => {
      tooltip.hidden = true;
      fit(lane.overlay);
    });
    plot.addEventListener("dblclick", () => place(...view.extent));
    plot.addEventListener("keydown", (event) => {
      const span = view.x1 - view.x0;
      const middle = (view.x0 + view.x1) / 2;
      const keys = {
        "+": () => zoom(middle, 0.5),
        "=": () => zoom(middle, 0.5),
        "-": () => zoom(middle, 2),
        ArrowLeft: () => place(view.x0 - span / 5, view.x1 - span / 5),
        ArrowRight: () => place(view.x0 + span / 5, view.x1 + span / 5),
        0: () => place(...view.extent),
        Home: () => place(...view.extent),
      };
      if (keys[event.key]) {
        event.preventDefault();
        keys[event.key]();
      }
    });
  }

  function timeAt(lane, clientX) {
    const { plot } = lane.last;
    const left = lane.canvas.getBoundingClientRect().left;
    const share = Math.min(1, Math.max(0, (clientX - left - plot.left) / (plot.right - plot.left)));
    return view.x0 + share * (view.x1 - view.x0);
  }

  // Zoom by ``factor`` (below 1: in) keeping the time under the pointer where it is.
  function zoom(time, factor) {
    const [low, high] = view.extent;
    const span = Math.min(high - low, Math.max((high - low) * 1e-9, (view.x1 - view.x0) * factor));
    const share = (time - view.x0) / (view.x1 - view.x0);
    place(time - share * span, time - share * span + span);
  }

  // Show [x0, x1], kept within the run.
  function place(x0, x1) {
    const [low, high] = view.extent;
    const span = Math.min(x1 - x0, high - low);
    x0 = Math.min(Math.max(x0, low), high - span);
    view.x0 = x0;
    view.x1 = x0 + span;
    schedule();
  }

  function hover(lane, event) {
    if (!lane.last) return;
    const { plot, x } = lane.last;
    const rect = lane.canvas.getBoundingClientRect();
    const px = event.clientX - rect.left;
    const py = event.clientY - rect.top;
    const { ctx } = fit(lane.overlay);
    if (px < plot.left || px > plot.right || py < plot.top || py > plot.bottom) {
      tooltip.hidden = true;
      return;
    }
    const time = timeAt(lane, event.clientX);
    const near = (NEAR * (view.x1 - view.x0)) / (plot.right - plot.left);
    const mark = lane.show.marks ? nearest(lane.markTimes, time, near) : -1;
    const gap = lane.show.gaps ? nearest(lane.gapTimes, time, near) : -1;
    let rows;
    let at = px;
    if (mark >= 0) {
      const { t, label, allocated, reserved } = lane.marks[mark];
      at = x(t);
      rows = [[label], [`at ${t.toFixed(3)} s`], [`allocated ${formatBytes(allocated)}`], [`reserved ${formatBytes(reserved)}`]];
    } else if (gap >= 0) {
      const [t, error] = lane.spec.gaps[gap];
      at = x(t - manifest.origin);
      rows = [["failed reading"], [`at ${(t - manifest.origin).toFixed(3)} s`], [lane.spec.errors[error]]];
    } else {
      rows = [[`${lane.spec.label} at ${time.toFixed(3)} s`]];
      for (const line of lane.lines) {
        if (!line.shown) continue;
        const index = bisectRight(line.times, time, 0, line.times.length) - 1; // the reading at or before
        if (index < 0) continue;
        const value = line.values[index];
        rows.push([`${line.label} ${value === value ? formatBytes(value) : "failed reading"}`, line.figure]);
      }
    }
    ctx.strokeStyle = mark >= 0 ? MARK_COLOUR : "rgba(0, 0, 0, 0.35)";
    ctx.setLineDash(mark >= 0 ? [] : [3, 3]);
    ctx.lineWidth = mark >= 0 ? 2 : 1;
    line(ctx, at, plot.top, at, plot.bottom);
    showTooltip(rows, event.clientX, event.clientY);
  }

  // The index of the time closest to ``time`` within ``near``, or -1.
  function nearest(times, time, near) {
    const index = bisectLeft(times, time, 0, times.length);
    let best = -1;
    for (const candidate of [index - 1, index]) {
      if (candidate < 0 || candidate >= times.length) continue;
      const distance = Math.abs(times[candidate] - time);
      if (distance <= near && (best < 0 || distance < Math.abs(times[best] - time))) best = candidate;
    }
    return best;
  }

  function showTooltip(rows, clientX, clientY) {
    tooltip.replaceChildren(
      ...rows.map(([text, figure]) => {
        const row = element("div");
        if (figure && STYLE[figure]) row.append(swatch(...STYLE[figure]));
        row.append(document.createTextNode(text));
        return row;
      }),
    );
    tooltip.hidden = false;
    const { width, height } = tooltip.getBoundingClientRect();
    const left = clientX + 14 + width > window.innerWidth ? clientX - 14 - width : clientX + 14;
    const top = clientY + 14 + height > window.innerHeight ? clientY - 14 - height : clientY + 14;
    tooltip.style.left = `${Math.max(0, left)}px`;
    tooltip.style.top = `${Math.max(0, top)}px`;
  }

  // --- comparisons ---------------------------------------------------------------------------

  function showComparison(comparison) {
    const section = element("section", { class: "comparison" });
    const machine = comparison.machine || {};
    const title = `unimem compare · ${machine.device || "?"} · size ${machine.size || "?"}`;
    section.append(element("h2", {}, title));
    const versions = Object.entries(machine.versions || {}).map(([name, version]) => `${name} ${version}`);
    const about = [machine.date, machine.python && `Python ${machine.python}`, ...versions, comparison.file];
    section.append(element("p", { class: "about" }, about.filter(Boolean).join(" · ")));
    const table = element("table");
    const head = element("tr");
    const texts = new Set(["framework", "workload", "config"]);
    for (const name of comparison.header) head.append(element("th", { class: texts.has(name) ? "text" : "" }, name));
    table.append(element("thead", {}, head));
    const body = element("tbody");
    for (const row of comparison.rows) {
      const tr = element("tr");
      row.forEach((cell, i) => tr.append(element("td", { class: texts.has(comparison.header[i]) ? "text" : "" }, cell)));
      body.append(tr);
    }
    table.append(body);
    section.append(element("div", { class: "table-wrap" }, table));
    section.append(fillList(element("ul", { class: "notes" }), comparison.notes));
    const charts = element("div", { class: "charts" });
    section.append(charts);
    document.getElementById("comparisons").append(section);
    for (const chart of comparison.charts) {
      const box = element("div", { class: "chart" });
      const canvas = element("canvas");
      box.append(canvas);
      charts.append(box);
      const state = { chart, comparison, canvas, bars: [] };
      view.charts.push(state);
      drawChart(state);
      canvas.addEventListener("pointermove", (event) => hoverBar(state, event));
      canvas.addEventListener("pointerleave", () => (tooltip.hidden = true));
    }
  }

  function drawChart(state) {
    const { chart, comparison, canvas } = state;
    const { ctx, width, height } = fit(canvas);
    const plot = { left: PAD.left, right: width - PAD.right, top: 24, bottom: height - 40 };
    ctx.font = "600 12px system-ui, sans-serif";
    ctx.fillStyle = "#222";
    ctx.textAlign = "left";
    ctx.textBaseline = "top";
    ctx.fillText(chart.title, plot.left, 4);
    const top = Math.max(0, ...chart.values.flat().filter((value) => value !== null));
    const [scale, unit] = chart.unit === "bytes" ? unitOf(top) : [1, chart.unit];
    const yMax = top > 0 ? top * 1.12 : scale;
    axesBars(ctx, plot, yMax, scale, unit);
    const groups = comparison.configs.length;
    const each = (plot.right - plot.left) / Math.max(1, groups);
    const bar = (each * 0.8) / Math.max(1, comparison.frameworks.length);
    state.bars = [];
    comparison.frameworks.forEach((framework, f) => {
      ctx.fillStyle = PALETTE[f % PALETTE.length];
      comparison.configs.forEach((config, c) => {
        const value = chart.values[f][c];
        const left = plot.left + c * each + each * 0.1 + f * bar;
        if (value === null) return;
        const h = (value / yMax) * (plot.bottom - plot.top);
        ctx.fillRect(left, plot.bottom - h, bar - 1, h);
        state.bars.push({ left, right: left + bar, top: plot.bottom - h, framework, config, value });
      });
    });
    ctx.fillStyle = "#333";
    ctx.font = "11px system-ui, sans-serif";
    ctx.textAlign = "center";
    ctx.textBaseline = "top";
    comparison.configs.forEach((config, c) => ctx.fillText(config, plot.left + (c + 0.5) * each, plot.bottom + 4));
    let at = plot.left;
    ctx.textAlign = "left";
    comparison.frameworks.forEach((framework, f) => {
      ctx.fillStyle = PALETTE[f % PALETTE.length];
      ctx.fillRect(at, plot.bottom + 22, 10, 10);
      ctx.fillStyle = "#333";
      ctx.fillText(framework, at + 14, plot.bottom + 21);
      at += 24 + ctx.measureText(framework).width;
    });
  }

  function axesBars(ctx, plot, yMax, scale, unit) {
    ctx.font = "11px system-ui, sans-serif";
    ctx.strokeStyle = "#e4e4e4";
    ctx.fillStyle = "#333";
    ctx.lineWidth = 1;
    ctx.textAlign = "right";
    ctx.textBaseline = "middle";
    const step = niceStep(yMax / scale / 5);
    for (const value of ticks(0, yMax / scale + 1e-9, step)) {
      const py = plot.bottom - ((value * scale) / yMax) * (plot.bottom - plot.top);
      line(ctx, plot.left, py, plot.right, py);
      ctx.fillText(`${trim(value, step)} ${unit}`, plot.left - 6, py);
    }
    ctx.strokeStyle = "#888";
    ctx.strokeRect(plot.left, plot.top, plot.right - plot.left, plot.bottom - plot.top);
  }

  function hoverBar(state, event) {
    const rect = state.canvas.getBoundingClientRect();
    const px = event.clientX - rect.left;
    const py = event.clientY - rect.top;
    const hit = state.bars.find((bar) => px >= bar.left && px < bar.right && py >= bar.top);
    if (!hit) {
      tooltip.hidden = true;
      return;
    }
    const value = state.chart.unit === "bytes" ? formatBytes(hit.value) : `${hit.value.toFixed(2)} ${state.chart.unit}`;
    showTooltip([[`${hit.framework} · ${hit.config}`], [value]], event.clientX, event.clientY);
  }

  // --- numbers and elements --------------------------------------------------------------------

  // unimem.sizes.format_bytes: binary units, two decimals (rounded half to even, as Python's
  // format does), "n/a" when unknown.
  function formatBytes(value) {
    if (value === null || value === undefined || value !== value) return "n/a";
    const sign = value < 0 ? "-" : "";
    const magnitude = Math.abs(value);
    const units = ["B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"];
    let power = 0;
    while (power < units.length - 1 && magnitude >= 1024 ** (power + 1)) power++;
    if (power === 0) return `${sign}${Math.round(magnitude)} B`;
    if (!Number.isSafeInteger(magnitude)) return `${sign}${(magnitude / 1024 ** power).toFixed(2)} ${units[power]}`;
    const scaled = BigInt(magnitude) * 100n;
    const divisor = 1024n ** BigInt(power);
    let whole = scaled / divisor;
    const twice = 2n * (scaled % divisor);
    if (twice > divisor || (twice === divisor && whole % 2n === 1n)) whole += 1n;
    const digits = whole.toString().padStart(3, "0");
    return `${sign}${digits.slice(0, -2)}.${digits.slice(-2)} ${units[power]}`;
  }

  // The largest binary unit not above ``biggest`` (as the PNG's axis).
  function unitOf(biggest) {
    for (const [scale, unit] of UNITS) if (biggest >= scale) return [scale, unit];
    return [1, "bytes"];
  }

  // The values from ``first`` to ``last`` ``step`` apart, at most MAX_TICKS of them: counted, not
  // summed, so a step too small to move a large value (a deep zoom far from the origin) ends too.
  function ticks(first, last, step) {
    const count = Math.min(MAX_TICKS, Math.floor((last - first) / step) + 1);
    const values = [];
    for (let k = 0; k < count; k++) values.push(first + k * step); // a count that is NaN: none
    return values;
  }

  function niceStep(raw) {
    if (!(raw > 0)) return 1;
    const power = 10 ** Math.floor(Math.log10(raw));
    const fraction = raw / power;
    return (fraction <= 1 ? 1 : fraction <= 2 ? 2 : fraction <= 5 ? 5 : 10) * power;
  }

  // A tick's label with the decimals its step needs (a sum of steps that should be 0 is 0, not -0.0).
  function trim(value, step) {
    const decimals = Math.max(0, Math.min(9, -Math.floor(Math.log10(step))));
    return (Math.abs(value) < step * 1e-6 ? 0 : value).toFixed(decimals);
  }

  // "1 mark", "3 marks": a count and its noun.
  function counted(count, noun) {
    return `${count.toLocaleString("en")} ${noun}${count === 1 ? "" : "s"}`;
  }

  function element(tag, attributes = {}, ...children) {
    const node = document.createElement(tag);
    for (const [name, value] of Object.entries(attributes)) if (value !== "") node.setAttribute(name, value);
    for (const child of children) node.append(child); // text is text: nothing read from a file is parsed as HTML
    return node;
  }

  function fillList(list, items) {
    for (const item of items) list.append(element("li", {}, item));
    return list;
  }
})();
