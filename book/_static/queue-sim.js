/* "Watch it": a worker pool draining a queue, in the reader's browser.
 *
 * The model below is a line-for-line port of handson/book/sim.py (the reference
 * the book build checks its numbers against); a test plays the same seeded scenario
 * through both and compares every tick. Keep the two in step: integer ticks,
 * mulberry32, and only +, *, /, floor and compare on floats.
 * No libraries, no network: a canvas for the pool, a canvas for the lag graph.
 */
(function () {
  "use strict";
  if (window.EOQueueSim) { return; }

  var TICK_S = 0.1, SLOTS_PER_TICK = 10, JOB_TICKS_MIN = 3, JOB_TICKS_SPAN = 5;
  var LEASE_TICKS = 30, RESTART_TICKS = 10, SPIKE_JOBS = 60;

  function mulberry32(a) {
    return function () {
      a |= 0; a = a + 0x6D2B79F5 | 0;
      var t = Math.imul(a ^ a >>> 15, 1 | a);
      t = t + Math.imul(t ^ t >>> 7, 61 | t) ^ t;
      return ((t ^ t >>> 14) >>> 0) / 4294967296;
    };
  }

  function Model(seed, arrivals, workers, ackBeforeWork) {
    this.seed = seed; this.arrivals = arrivals; this.workers = 0;
    this.ackBeforeWork = !!ackBeforeWork;
    this.tick = 0; this.queue = []; this.orphans = []; this.pool = [];
    this.done = 0; this.redelivered = 0; this.lost = 0; this.arrived = 0;
    this.kills = 0; this.history = [];
    this.rng = mulberry32(seed); this.nextId = 1;
    this.setWorkers(workers);
  }

  Model.prototype.setArrivals = function (rate) { this.arrivals = +rate; };
  Model.prototype.setAckBeforeWork = function (on) { this.ackBeforeWork = !!on; };

  Model.prototype.setWorkers = function (n) {
    n = Math.max(0, Math.floor(n));
    var active = this.pool.filter(function (w) { return !w.retiring; });
    var i, w;
    for (i = 0; i < this.pool.length; i++) {
      if (active.length >= n) { break; }
      w = this.pool[i];
      if (w.retiring) { w.retiring = false; active.push(w); }
    }
    while (active.length < n) {
      w = { state: "idle", job: null, left: 0, retiring: false };
      this.pool.push(w); active.push(w);
    }
    var extra = active.length - n;
    for (i = this.pool.length - 1; i >= 0; i--) {
      if (extra <= 0) { break; }
      w = this.pool[i];
      if (w.retiring) { continue; }
      extra -= 1;
      if (w.state === "busy") { w.retiring = true; } else { this.pool.splice(i, 1); }
    }
    this.workers = n;
  };

  Model.prototype.arrive = function () {
    this.queue.push({ id: this.nextId, retry: false, acked: false, deadline: 0 });
    this.nextId += 1; this.arrived += 1;
  };

  Model.prototype.spike = function (n) {
    n = (n === undefined || n === null) ? SPIKE_JOBS : n;
    for (var i = 0; i < n; i++) { this.arrive(); }
  };

  Model.prototype.killBusy = function () {
    var busy = [], i;
    for (i = 0; i < this.pool.length; i++) {
      if (this.pool[i].state === "busy") { busy.push(i); }
    }
    if (!busy.length) { return null; }
    i = busy[Math.floor(this.rng() * busy.length)];
    var w = this.pool[i], job = w.job;
    w.job = null; w.state = "dead"; w.left = RESTART_TICKS;
    this.kills += 1;
    if (job.acked) { this.lost += 1; } else { this.orphans.push(job); }
    return i;
  };

  Model.prototype.step = function () {
    var self = this, i, w;
    this.tick += 1;
    var p = this.arrivals / 100;
    for (i = 0; i < SLOTS_PER_TICK; i++) {
      if (this.rng() < p) { this.arrive(); }
    }
    var expired = this.orphans.filter(function (j) { return j.deadline <= self.tick; });
    if (expired.length) {
      this.orphans = this.orphans.filter(function (j) { return j.deadline > self.tick; });
      expired.forEach(function (j) { j.retry = true; });
      this.queue = expired.concat(this.queue);
      this.redelivered += expired.length;
    }
    for (i = 0; i < this.pool.length; i++) {
      w = this.pool[i];
      if (w.state === "dead") {
        w.left -= 1;
        if (w.left === 0) { w.state = "idle"; }
      } else if (w.state === "busy") {
        w.left -= 1;
        if (w.left === 0) { this.done += 1; w.state = "idle"; w.job = null; }
      }
    }
    this.pool = this.pool.filter(function (x) { return !(x.retiring && x.state !== "busy"); });
    for (i = 0; i < this.pool.length; i++) {
      w = this.pool[i];
      if (w.state === "idle" && this.queue.length) {
        var job = this.queue.shift();
        job.acked = this.ackBeforeWork;
        job.deadline = this.tick + LEASE_TICKS;
        w.state = "busy"; w.job = job;
        w.left = JOB_TICKS_MIN + Math.floor(this.rng() * JOB_TICKS_SPAN);
      }
    }
    this.history.push(this.queue.length);
  };

  Model.prototype.busy = function () {
    return this.pool.filter(function (w) { return w.state === "busy"; }).length;
  };

  Model.prototype.row = function () {
    return [this.tick, this.queue.length, this.busy(), this.orphans.length,
      this.done, this.redelivered, this.lost, this.arrived];
  };

  Model.prototype.capacity = function () {
    return this.workers / ((JOB_TICKS_MIN + (JOB_TICKS_SPAN - 1) / 2) * TICK_S);
  };

  function applyEvent(sim, action, arg) {
    if (action === "spike") { sim.spike(arg); }
    else if (action === "kill") { sim.killBusy(); }
    else if (action === "workers") { sim.setWorkers(arg); }
    else if (action === "arrivals") { sim.setArrivals(arg); }
    else if (action === "ack_before_work") { sim.setAckBeforeWork(arg); }
    else { throw new Error("unknown scenario action " + action); }
  }

  /* The same scenario format as handson.book.sim.run_scenario. */
  function runScenario(sc) {
    var sim = new Model(sc.seed, sc.arrivals, sc.workers, sc.ack_before_work);
    var byTick = {}, trace = [], t;
    (sc.events || []).forEach(function (ev) {
      (byTick[ev[0]] = byTick[ev[0]] || []).push(ev);
    });
    for (t = 1; t <= sc.ticks; t++) {
      (byTick[t] || []).forEach(function (ev) { applyEvent(sim, ev[1], ev[2]); });
      sim.step();
      trace.push(sim.row());
    }
    return trace;
  }

  /* ---------------------------------------------------------------- view -- */
  var CSS = [
    ".eo-qsim{font:14px/1.4 system-ui,sans-serif;border:1px solid #ccc;",
    "border-radius:6px;padding:10px;max-width:700px;background:#fff;color:#222}",
    ".eo-qsim .eo-row{display:flex;flex-wrap:wrap;gap:10px 18px;align-items:center;",
    "margin:4px 0}",
    ".eo-qsim label{display:flex;gap:6px;align-items:center}",
    /* The widget draws on white in either theme: its controls say so explicitly,
       so a dark theme's light text colour cannot make them vanish. */
    ".eo-qsim{color-scheme:light}",
    ".eo-qsim button{width:auto;padding:3px 10px;border:1px solid #555;border-radius:4px;",
    "background:#f4f4f4;color:#222;cursor:pointer}",
    ".eo-qsim select,.eo-qsim input{color:#222;background:#fff}",
    ".eo-qsim button.kill{border-color:#b22;color:#b22}",
    /* Below 600 px the drawings scroll sideways instead of shrinking their
       labels to a few pixels. */
    ".eo-qsim .eo-canvases{overflow-x:auto}",
    ".eo-qsim canvas{width:100%;min-width:600px;height:auto;display:block;",
    "margin-top:6px}",
    ".eo-qsim .eo-counters span{font-variant-numeric:tabular-nums}",
    ".eo-qsim .eo-counters b{font-size:16px}",
    ".eo-qsim .eo-note{color:#555;font-size:12px;min-height:1.4em}"
  ].join("");

  var errors = [];   /* errors raised by this widget's own code, for the tests */
  function guard(fn) {
    return function () {
      try { return fn.apply(this, arguments); } catch (e) {
        errors.push(String(e && e.stack || e)); throw e;
      }
    };
  }

  function el(tag, attrs, text) {
    var e = document.createElement(tag);
    Object.keys(attrs || {}).forEach(function (k) { e.setAttribute(k, attrs[k]); });
    if (text !== undefined) { e.textContent = text; }
    return e;
  }

  function mount(root, opts) { return guard(mountView)(root, opts); }

  function mountView(root, opts) {
    opts = opts || {};
    if (root.dataset.eoMounted) { return root.eoSim; }
    root.dataset.eoMounted = "1";
    if (!document.getElementById("eo-qsim-css")) {
      var st = el("style", { id: "eo-qsim-css" }); st.textContent = CSS;
      document.head.appendChild(st);
    }
    root.classList.add("eo-qsim");
    var seed = opts.seed || 1;
    var sim = new Model(seed, opts.arrivals || 6, opts.workers || 4, false);
    var speed = 1, paused = false, note = "";

    var r1 = el("div", { "class": "eo-row" });
    var arrL = el("label"), arr = el("input", { type: "range", min: "0", max: "12",
      step: "0.5", value: String(sim.arrivals), "data-qsim": "arrivals" });
    var arrV = el("span"); arrL.append("arrivals/s", arr, arrV);
    var wkL = el("label"), wk = el("input", { type: "range", min: "1", max: "8",
      step: "1", value: String(sim.workers), "data-qsim": "workers" });
    var wkV = el("span"); wkL.append("workers", wk, wkV);
    var capV = el("span", { "data-qsim": "capacity" });
    r1.append(arrL, wkL, capV);

    var r2 = el("div", { "class": "eo-row" });
    var spikeB = el("button", { type: "button", "data-qsim": "spike" }, "Spike +60");
    var killB = el("button", { type: "button", "class": "kill", "data-qsim": "kill" },
      "Kill -9 a busy worker");
    var ackL = el("label"), ack = el("input", { type: "checkbox", "data-qsim": "ack" });
    ackL.append(ack, "Ack before work");
    var spL = el("label"), sp = el("select", { "data-qsim": "speed" });
    ["1", "2", "4"].forEach(function (v) { sp.append(el("option", { value: v }, v + "×")); });
    spL.append("speed", sp);
    var pauseB = el("button", { type: "button", "data-qsim": "pause" }, "Pause");
    var resetB = el("button", { type: "button", "data-qsim": "reset" }, "Reset");
    r2.append(spikeB, killB, ackL, spL, pauseB, resetB);

    var counters = el("div", { "class": "eo-row eo-counters" });
    var cv = {};
    [["t", "time"], ["waiting", "waiting"], ["done", "done"],
      ["redelivered", "redelivered"], ["lost", "lost"]].forEach(function (c) {
      var s = el("span"); var b = el("b", { "data-qsim-counter": c[0] }, "0");
      s.append(c[1] + " ", b); counters.append(s); cv[c[0]] = b;
    });
    var noteE = el("div", { "class": "eo-note", "data-qsim": "note" });
    var pool = el("canvas", { width: "680", height: "250", "data-qsim": "pool",
      role: "img", "aria-label": "queue, workers and leased jobs" });
    var lag = el("canvas", { width: "680", height: "150", "data-qsim": "lag",
      role: "img", "aria-label": "lag: waiting jobs over the last 60 seconds" });
    var canvases = el("div", { "class": "eo-canvases" });
    canvases.append(pool, lag);
    root.append(r1, r2, counters, noteE, canvases);

    function labels() {
      arrV.textContent = (+arr.value).toFixed(1);
      wkV.textContent = wk.value;
      capV.textContent = "capacity " + sim.capacity().toFixed(0) + "/s";
    }
    function on(e, ev, fn) { e.addEventListener(ev, guard(fn)); }
    on(arr, "input", function () { sim.setArrivals(+arr.value); labels(); });
    on(wk, "input", function () { sim.setWorkers(+wk.value); labels(); draw(); });
    on(ack, "change", function () { sim.setAckBeforeWork(ack.checked); });
    on(sp, "change", function () { speed = +sp.value; });
    on(spikeB, "click", function () { sim.spike(SPIKE_JOBS); note = ""; draw(); });
    on(killB, "click", function () {
      var i = sim.killBusy();
      note = i === null ? "No worker is busy right now: nothing to kill."
        : "Killed worker " + (i + 1) + (sim.ackBeforeWork
          ? ": its job was acked at the claim, so it is gone."
          : ": its job waits for the lease to run out.");
      draw();
    });
    on(pauseB, "click", function () {
      paused = !paused; pauseB.textContent = paused ? "Resume" : "Pause";
    });
    on(resetB, "click", function () {
      sim = new Model(seed, +arr.value, +wk.value, ack.checked); note = ""; labels();
      draw();
    });

    function box(ctx, x, y, s, fill, stroke) {
      ctx.fillStyle = fill; ctx.fillRect(x, y, s, s);
      ctx.strokeStyle = stroke; ctx.lineWidth = 1.5; ctx.strokeRect(x, y, s, s);
    }

    function drawPool() {
      var ctx = pool.getContext("2d"), W = pool.width, i, x, y;
      ctx.clearRect(0, 0, W, pool.height);
      ctx.fillStyle = "#222"; ctx.font = "13px system-ui,sans-serif";
      ctx.fillText("queue (head on the left)", 8, 16);
      var s = 13, per = Math.floor((W - 16) / (s + 3)), shown = Math.min(sim.queue.length,
        per * 3);
      for (i = 0; i < shown; i++) {
        x = 8 + (i % per) * (s + 3); y = 24 + Math.floor(i / per) * (s + 3);
        var j = sim.queue[i];
        box(ctx, x, y, s, j.retry ? "#1f2d5a" : "#dce6ff", "#1f2d5a");
      }
      if (sim.queue.length > shown) {
        ctx.fillStyle = "#222";
        ctx.fillText("+" + (sim.queue.length - shown) + " more", W - 80, 16);
      }
      ctx.fillStyle = "#222"; ctx.fillText("workers", 8, 96);
      for (i = 0; i < sim.pool.length; i++) {
        var w = sim.pool[i]; x = 8 + i * 82; y = 104;
        ctx.globalAlpha = w.retiring ? 0.45 : 1;
        ctx.fillStyle = w.state === "dead" ? "#fbe3e3" : "#f2f2f2";
        ctx.fillRect(x, y, 74, 52);
        ctx.strokeStyle = w.state === "dead" ? "#b22" : "#555";
        ctx.strokeRect(x, y, 74, 52);
        ctx.fillStyle = "#222"; ctx.fillText("W" + (i + 1), x + 5, y + 15);
        if (w.state === "busy") {
          box(ctx, x + 50, y + 4, 16, w.job.retry ? "#1f2d5a" : "#dce6ff", "#1f2d5a");
          ctx.fillStyle = "#3a7"; ctx.fillRect(x + 5, y + 38,
            64 * (w.left / (JOB_TICKS_MIN + JOB_TICKS_SPAN - 1)), 8);
          ctx.fillStyle = "#555"; ctx.fillText(w.job.acked ? "acked" : "leased",
            x + 5, y + 32);
        } else if (w.state === "dead") {
          ctx.strokeStyle = "#b22"; ctx.beginPath();
          ctx.moveTo(x + 50, y + 6); ctx.lineTo(x + 66, y + 22);
          ctx.moveTo(x + 66, y + 6); ctx.lineTo(x + 50, y + 22); ctx.stroke();
          ctx.fillStyle = "#b22"; ctx.fillText("killed", x + 5, y + 32);
        } else {
          ctx.fillStyle = "#777"; ctx.fillText("idle", x + 5, y + 32);
        }
        ctx.globalAlpha = 1;
      }
      ctx.fillStyle = "#222";
      ctx.fillText("leased, owner dead (back to the head when the lease runs out)", 8, 182);
      for (i = 0; i < sim.orphans.length && i < 8; i++) {
        var o = sim.orphans[i]; x = 8 + i * 82; y = 190;
        ctx.setLineDash([4, 3]); box(ctx, x, y, 20, "#fff", "#b22"); ctx.setLineDash([]);
        ctx.fillStyle = "#b22";
        ctx.fillText(((o.deadline - sim.tick) * TICK_S).toFixed(1) + " s", x + 26, y + 15);
      }
      ctx.fillStyle = "#555";
      ctx.fillText("light: new job   dark: a retry (redelivered)", 8, 240);
    }

    function drawLag() {
      var ctx = lag.getContext("2d"), W = lag.width, H = lag.height;
      var h = sim.history.slice(-600), i, top = 10;
      for (i = 0; i < h.length; i++) { if (h[i] > top) { top = h[i]; } }
      top = Math.ceil(top / 10) * 10;
      ctx.clearRect(0, 0, W, H);
      ctx.strokeStyle = "#ccc"; ctx.strokeRect(40, 8, W - 48, H - 30);
      ctx.fillStyle = "#222"; ctx.font = "12px system-ui,sans-serif";
      ctx.fillText(String(top), 6, 16); ctx.fillText("0", 26, H - 22);
      ctx.fillText("waiting jobs, last 60 s", 48, H - 6);
      ctx.strokeStyle = "#1f2d5a"; ctx.lineWidth = 1.5; ctx.beginPath();
      for (i = 0; i < h.length; i++) {
        var x = 40 + (W - 48) * (i + 600 - h.length) / 600;
        var y = H - 22 - (H - 30) * h[i] / top;
        if (i === 0) { ctx.moveTo(x, y); } else { ctx.lineTo(x, y); }
      }
      ctx.stroke();
    }

    function draw() {
      cv.t.textContent = (sim.tick * TICK_S).toFixed(1) + " s";
      cv.waiting.textContent = String(sim.queue.length);
      cv.done.textContent = String(sim.done);
      cv.redelivered.textContent = String(sim.redelivered);
      cv.lost.textContent = String(sim.lost);
      noteE.textContent = note;
      drawPool(); drawLag();
    }

    var last = performance.now(), acc = 0;
    var timer = setInterval(guard(function () {
      if (!root.isConnected) { clearInterval(timer); return; }
      var now = performance.now();
      if (!paused) { acc += (now - last) * speed; }
      last = now;
      var n = 0;
      while (acc >= TICK_S * 1000 && n < 80) { sim.step(); acc -= TICK_S * 1000; n++; }
      if (n === 80) { acc = 0; }
      if (n) { draw(); }
    }), 40);

    labels(); draw();
    root.eoSim = { model: function () { return sim; } };
    return root.eoSim;
  }

  /* ---------------------------------------------------------- calculator -- */
  /* Little's Law for a pool: capacity = workers / seconds per job, and a
   * backlog B drains in B / (capacity - arrivals). handson.book.sim has the same
   * two formulas (pool_capacity, predicted_drain_s); the browser test checks
   * that this form shows what the build computed. */
  function drainText(backlog, sPerJob, workers, arrivals) {
    var cap = workers / sPerJob;
    if (!(backlog >= 0) || !(sPerJob > 0) || !(workers > 0) || !(arrivals >= 0)) {
      return "enter positive numbers";
    }
    if (cap <= arrivals) {
      return "never: capacity " + cap.toFixed(1) + "/s is not above arrivals";
    }
    var s = backlog / (cap - arrivals);
    return Math.round(s).toLocaleString("en-US") + " s (" + (s / 3600).toFixed(2) +
      " h)";
  }

  function mountCalculator(root, opts) { return guard(mountCalc)(root, opts); }

  function mountCalc(root, opts) {
    if (root.dataset.eoMounted) { return; }
    root.dataset.eoMounted = "1";
    root.classList.add("eo-qsim");
    if (!document.getElementById("eo-qsim-css")) {
      var st = el("style", { id: "eo-qsim-css" }); st.textContent = CSS;
      document.head.appendChild(st);
    }
    var fields = [["backlog", "jobs waiting", opts.backlog],
      ["s_per_job", "seconds per job", opts.s_per_job],
      ["workers", "workers", opts.workers],
      ["arrivals", "new jobs per second", opts.arrivals]];
    var inputs = {}, row = el("div", { "class": "eo-row" });
    fields.forEach(function (f) {
      var l = el("label"), i = el("input", { type: "number", min: "0", step: "any",
        value: String(f[2]), "data-calc": f[0], style: "width:8em" });
      l.append(f[1], i); row.append(l); inputs[f[0]] = i;
    });
    var cap = el("div", { "data-calc": "capacity" });
    var outL = el("div"), out = el("b", { "data-calc": "drain" });
    outL.append("time to finish: ", out);
    function update() {
      var v = {};
      Object.keys(inputs).forEach(function (k) { v[k] = parseFloat(inputs[k].value); });
      cap.textContent = "capacity: " + (v.workers / v.s_per_job).toLocaleString(
        "en-US", { maximumFractionDigits: 1 }) + " jobs/s";
      out.textContent = drainText(v.backlog, v.s_per_job, v.workers, v.arrivals);
    }
    Object.keys(inputs).forEach(function (k) {
      inputs[k].addEventListener("input", guard(update));
    });
    root.append(row, cap, outL);
    update();
  }

  window.EOQueueSim = {
    Model: Model, mulberry32: mulberry32, runScenario: runScenario, mount: mount,
    mountCalculator: mountCalculator, drainText: drainText, errors: errors,
    TICK_S: TICK_S, LEASE_TICKS: LEASE_TICKS
  };
}());
