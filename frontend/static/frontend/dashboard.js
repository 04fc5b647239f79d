/* spotpipe dashboard: fetch the page's JSON endpoint (body[data-endpoint]) and draw it with
 * plotly.js. One renderer per page (body[data-page]); live pages poll and redraw with
 * Plotly.react, which keeps zoom and only updates what changed. No framework, no CDN. */
(function () {
  "use strict";

  const body = document.body;
  const page = body.dataset.page;
  const endpoint = body.dataset.endpoint;
  const PLOT_CONFIG = { responsive: true, displaylogo: false, modeBarButtonsToRemove: ["lasso2d", "select2d"] };
  const GENERATION_LINES = 2; // earlier generations shown as lines before "N earlier generation(s)"
  const RECONF_ROWS = 5; // the reconfigurations table's newest rows
  let generationsOpen = false;
  const POLL_MS = { overview: 30000, fleet: 30000, jobs: 15000, job: 5000, notices: 15000 };
  const COLORS = ["#2563eb", "#dc2626", "#16a34a", "#9333ea", "#ea580c", "#0891b2", "#ca8a04", "#db2777"];
  const STATE_COLORS = {
    requested: "#94a3b8", pending: "#60a5fa", running: "#16a34a", notice: "#f59e0b",
    preempted: "#dc2626", terminated: "#475569", failed: "#7f1d1d",
  };

  function el(id) { return document.getElementById(id); }

  function baseLayout(extra) {
    return Object.assign({
      margin: { l: 50, r: 10, t: 10, b: 40 },
      font: { family: "system-ui, sans-serif", size: 12 },
      legend: { orientation: "h", y: -0.2 },
      paper_bgcolor: "rgba(0,0,0,0)", plot_bgcolor: "rgba(0,0,0,0)",
      hovermode: "closest",
    }, extra || {}, {
      xaxis: Object.assign({ automargin: true }, (extra || {}).xaxis || {}),
      yaxis: Object.assign({ automargin: true }, (extra || {}).yaxis || {}),
    });
  }

  function showEmpty(id, message) {
    const node = el(id);
    if (!node) return;
    if (node.data) Plotly.purge(node);
    node.classList.add("is-empty");
    node.dataset.points = "0";
    node.innerHTML = "";
    const p = document.createElement("p");
    p.className = "empty";
    p.textContent = message;
    node.appendChild(p);
  }

  /* Draw `traces` into #id, or an empty-state message when no trace has a point. */
  function plot(id, traces, layout, emptyMessage) {
    const node = el(id);
    if (!node) return;
    const points = traces.reduce((n, t) => n + ((t.y || t.x || []).length || 0), 0);
    if (!points) { showEmpty(id, emptyMessage || "Nothing to show yet."); return; }
    if (node.classList.contains("is-empty")) { node.classList.remove("is-empty"); node.innerHTML = ""; }
    node.dataset.points = String(points);
    Plotly.react(node, traces, baseLayout(layout), PLOT_CONFIG);
  }

  function text(value) { return value === null || value === undefined || value === "" ? "–" : String(value); }
  function money(value) { return value === null || value === undefined ? "–" : "$" + Number(value).toFixed(2); }
  function pct(value) { return value === null || value === undefined ? "–" : (100 * value).toFixed(1) + "%"; }
  function when(iso) { return iso ? iso.replace("T", " ").slice(0, 19) : "–"; }

  /* A table from rows; columns: [{label, value(row) -> string | Node, num}] */
  function table(id, columns, rows, emptyMessage) {
    const node = el(id);
    if (!node) return;
    node.innerHTML = "";
    if (!rows.length) {
      if (!emptyMessage) return;
      const p = document.createElement("p");
      p.className = "empty";
      p.textContent = emptyMessage;
      node.appendChild(p);
      return;
    }
    const wrap = document.createElement("div");
    wrap.className = "table-wrap";
    const t = document.createElement("table");
    const head = t.createTHead().insertRow();
    columns.forEach((c) => {
      const th = document.createElement("th");
      th.scope = "col";
      th.textContent = c.label;
      if (c.num) th.className = "num";
      head.appendChild(th);
    });
    const tbody = t.createTBody();
    rows.forEach((row) => {
      const tr = tbody.insertRow();
      columns.forEach((c) => {
        const td = tr.insertCell();
        const v = c.value(row);
        if (v instanceof Node) td.appendChild(v); else td.textContent = text(v);
        if (c.num) td.className = "num";
      });
    });
    wrap.appendChild(t);
    node.appendChild(wrap);
  }

  function link(href, label) {
    const a = document.createElement("a");
    a.href = href;
    a.textContent = label;
    return a;
  }

  /* A POST button for a page action (`url` from the data endpoint, null when the user may not take
   * it). The CSRF token is the page's own (every logged-in page has one, in the log-out form).
   * `ask`, when given, is a question whose answer (null: cancelled) goes in the form's `field`. */
  function actionButton(url, label, opts) {
    if (!url) return "";
    const o = opts || {};
    const form = document.createElement("form");
    form.method = "post";
    form.action = url;
    form.className = "inline";
    const csrf = document.querySelector("input[name=csrfmiddlewaretoken]");
    const token = document.createElement("input");
    token.type = "hidden";
    token.name = "csrfmiddlewaretoken";
    token.value = csrf ? csrf.value : "";
    form.appendChild(token);
    const button = document.createElement("button");
    button.type = "submit";
    button.className = o.danger ? "link-danger" : "link-action";
    button.textContent = label;
    if (o.title) button.setAttribute("aria-label", o.title);
    form.appendChild(button);
    if (o.ask) {
      const answer = document.createElement("input");
      answer.type = "hidden";
      answer.name = o.field;
      form.appendChild(answer);
      form.addEventListener("submit", (event) => {
        const reply = window.prompt(o.ask, "");
        if (reply === null) { event.preventDefault(); return; }
        answer.value = reply;
      });
    }
    return form;
  }

  function setText(id, value) { const n = el(id); if (n) n.textContent = value; }

  async function fetchJSON(url) {
    const response = await fetch(url, { headers: { Accept: "application/json" }, credentials: "same-origin" });
    if (!response.ok) throw new Error(url + " answered " + response.status);
    return response.json();
  }

  // --- pages ---------------------------------------------------------------------------------

  function renderOverview(d) {
    const states = Object.keys(d.nodes_by_state);
    const live = ["requested", "pending", "running", "notice"].reduce((n, s) => n + (d.nodes_by_state[s] || 0), 0);
    setText("kpi-running", String(d.running_jobs.filter((j) => j.status === "running" || j.status === "recovering").length));
    setText("kpi-nodes", String(live));
    setText("kpi-rate", money(d.spend_rate_per_hour) + "/h");
    setText("kpi-rate-od", "on-demand would be " + money(d.on_demand_rate_per_hour) + "/h");
    setText("kpi-month", money(d.month.cost));
    setText("kpi-savings", "saved " + money(d.month.savings) + " against on-demand");
    const counts = states.map((s) => d.nodes_by_state[s]);
    plot("chart-nodes", counts.some((c) => c > 0) ? [{
      type: "bar", x: states, y: counts, marker: { color: states.map((s) => STATE_COLORS[s] || "#64748b") },
    }] : [], { yaxis: { title: { text: "nodes" }, rangemode: "tozero" } },
    "No nodes yet: nodes appear when a job is planned and capacity is acquired.");
    const spent = d.daily.cost.some((v) => v > 0);
    plot("chart-daily", spent ? [
      { type: "bar", name: "spend", x: d.daily.x, y: d.daily.cost, marker: { color: COLORS[0] } },
      { type: "bar", name: "saved vs on-demand", x: d.daily.x, y: d.daily.savings, marker: { color: COLORS[2] } },
    ] : [], { barmode: "stack", yaxis: { title: { text: "USD" } } }, "No spend this month yet.");
    table("table-active", [
      { label: "Job", value: (j) => link("/jobs/" + j.id + "/", j.name) },
      { label: "Team", value: (j) => j.team__slug },
      { label: "Status", value: (j) => j.status },
      { label: "Progress", value: (j) => pct(j.progress), num: true },
    ], d.running_jobs, "No active jobs right now.");
  }

  function renderPrices(d) {
    const select = el("pool-select");
    if (select && !select.options.length) {
      d.available.forEach((p) => {
        const o = new Option(p.name, p.key, false, d.selected.includes(p.key));
        select.add(o);
      });
    }
    const traces = [];
    d.series.forEach((s, i) => {
      const color = COLORS[i % COLORS.length];
      // The band from the lowest to the highest change in each bucket, under the mean line.
      traces.push({ type: "scatter", mode: "lines", name: s.name + " range", x: s.x, y: s.max, showlegend: false,
        line: { shape: "hv", width: 0, color }, hoverinfo: "skip" });
      traces.push({ type: "scatter", mode: "lines", name: s.name + " range", x: s.x, y: s.min, showlegend: false,
        fill: "tonexty", fillcolor: color + "22", line: { shape: "hv", width: 0, color }, hoverinfo: "skip" });
      traces.push({ type: "scatter", mode: "lines", name: s.name, x: s.x, y: s.y, line: { shape: "hv", color, width: 2 },
        hovertemplate: "%{y:$.4f}/h<extra>" + s.name + "</extra>" });
    });
    d.on_demand.forEach((o, i) => {
      traces.push({ type: "scatter", mode: "lines", name: o.name, x: o.x, y: o.y,
        line: { dash: "dash", color: "#64748b", width: 1 + (i % 2) }, hovertemplate: "%{y:$.4f}/h<extra>on-demand</extra>" });
    });
    const hasPoints = d.series.some((s) => s.y.length);
    plot("chart-prices", hasPoints ? traces : [], { yaxis: { title: { text: "USD per hour" }, rangemode: "tozero" } },
      "No spot prices stored yet. Load a price history (manage.py ingest_spot_prices) or wait for the periodic pull.");
    const minutes = Math.round(d.bucket_seconds / 60);
    setText("bucket-note", hasPoints ? "One point per " + (minutes >= 60 ? (minutes / 60) + " h" : minutes + " min") +
      " bucket (mean of the changes in it, band = lowest to highest), " + d.series.reduce((n, s) => n + s.changes, 0) +
      " price changes in the period, read from the " + d.source + "." : "");
    const columns = [
      { label: "Pool", value: (p) => p.name },
      { label: "Spot $/h", value: (p) => p.price, num: true },
      { label: "On-demand $/h", value: (p) => p.on_demand, num: true },
      { label: "Savings", value: (p) => (p.savings_pct === null ? null : p.savings_pct + "%"), num: true },
      { label: "Interruptions (observed)", value: (p) => (p.interruption ? p.interruption.bucket + " of " + p.interruption.instances : "no data") },
    ];
    table("table-selected", columns, d.selected_pools, "No pool selected.");
    table("table-cheapest", columns, d.cheapest, "No priced pools yet.");
  }

  function stacked(id, block, emptyMessage, title) {
    plot(id, block.series.map((s) => ({ type: "bar", name: s.name, x: block.x, y: s.y,
      marker: { color: STATE_COLORS[s.name] || "#64748b" } })), { barmode: "stack", yaxis: { title: { text: title } } }, emptyMessage);
  }

  function renderFleet(d) {
    plot("chart-state", d.by_state.x.length ? [{ type: "bar", x: d.by_state.x, y: d.by_state.y,
      marker: { color: d.by_state.x.map((s) => STATE_COLORS[s] || "#64748b") } }] : [], {},
      "No instances in the last 7 days. They appear when a job acquires capacity.");
    stacked("chart-zone", d.by_zone, "No instances to group by zone.", "instances");
    stacked("chart-type", d.by_type, "No instances to group by type.", "instances");
    plot("chart-timeline", d.timeline.map((t, i) => ({
      type: "scatter", mode: "markers", name: t.name, x: t.x, y: t.x.map(() => t.name), text: t.text,
      marker: { size: 10, symbol: t.name === "preempted" ? "x" : "circle", color: t.name === "preempted" ? "#dc2626" : COLORS[i % COLORS.length] },
      hovertemplate: "%{x}<br>%{text}<extra>%{y}</extra>",
    })), { showlegend: false, margin: { l: 150, r: 10, t: 10, b: 40 } }, "No notices or preemptions in the last 7 days.");
    const shown = d.timeline_notices;
    setText("timeline-note", shown.total > shown.shown ? "Showing the newest " + shown.shown + " of " + shown.total +
      " notices in the window; the Notices page has the log." : "");
    table("table-live", [
      { label: "Instance", value: (r) => r.provider_instance_id || "instance " + r.id },
      { label: "State", value: (r) => r.state },
      { label: "Type", value: (r) => r.instance_type__name },
      { label: "Zone", value: (r) => r.zone__code },
      { label: "Lifecycle", value: (r) => r.lifecycle },
      { label: "Job", value: (r) => (r.job_id ? link("/jobs/" + r.job_id + "/", r.job__name) : "–") },
      { label: "Last heartbeat", value: (r) => when(r.last_heartbeat_at) },
      { label: "Actions", value: (r) => actionButton(r.terminate_url, "Terminate", {
        danger: true, field: "reason", title: "Terminate " + (r.provider_instance_id || "instance " + r.id),
        ask: "Terminate " + (r.provider_instance_id || "instance " + r.id) + " now? Its job, if any, continues " +
          "without it. Reason (optional):" }) },
    ], d.live_instances, "No live instances.");
    table("table-unavailable", [
      { label: "Offering", value: (u) => u.pool },
      { label: "Provider", value: (u) => u.provider },
      { label: "Capacity type", value: (u) => u.capacity_type },
      { label: "Reason", value: (u) => (u.reason === "no_capacity" ? "no capacity (" + u.code + ")" : "preempted us") },
      { label: "Until", value: (u) => when(u.until) },
    ], d.unavailable_offerings || [], "Every offering is available.");
  }

  function renderJobs(d) {
    table("table-jobs", [
      { label: "Job", value: (j) => link("/jobs/" + j.id + "/", j.name) },
      { label: "Team", value: (j) => j.team__slug },
      { label: "Status", value: (j) => j.status },
      { label: "Strategy", value: (j) => j.strategy },
      { label: "Progress", value: (j) => pct(j.progress) + " (" + j.steps_done + "/" + j.target_steps + ")", num: true },
      { label: "Throughput (samples/s)", value: (j) => (j.throughput === null ? null : j.throughput.toFixed(1)), num: true },
      { label: "Cost so far", value: (j) => money(j.cost_so_far), num: true },
      { label: "Budget", value: (j) => money(j.budget_usd), num: true },
      { label: "Cost report", value: (j) => link("/jobs/" + j.id + "/cost/", "cost") },
    ], d.jobs, "No jobs yet.");
  }

  function renderLayouts(layouts) {
    const node = el("layouts");
    node.innerHTML = "";
    if (!layouts.length) {
      const p = document.createElement("p");
      p.className = "empty";
      p.textContent = "No generation yet: the layout appears once the job is planned and its nodes join.";
      node.appendChild(p);
      return;
    }
    // The current generation (else the newest) drawn in full; earlier ones one line each, newest
    // first, with what changed from the one before; beyond the newest few, inside a closed <details>.
    const open = layouts.find((g) => g.current) || layouts[layouts.length - 1];
    node.appendChild(drawGeneration(open));
    const earlier = layouts.filter((g) => g !== open).reverse();
    if (!earlier.length) return;
    const line = (g) => {
      const li = document.createElement("li");
      li.className = "generation-line";
      li.dataset.generation = String(g.number);
      const head = document.createElement("strong");
      head.textContent = "Generation " + g.number;
      li.appendChild(head);
      const rest = " · " + when(g.created_at) + (g.reason ? " · " + g.reason : "") + " · " + (g.changes || []).join("; ");
      li.appendChild(document.createTextNode(rest));
      li.title = "Generation " + g.number + rest;
      return li;
    };
    const list = document.createElement("ul");
    list.className = "generation-lines";
    earlier.slice(0, GENERATION_LINES).forEach((g) => list.appendChild(line(g)));
    node.appendChild(list);
    if (earlier.length > GENERATION_LINES) {
      const more = document.createElement("details");
      more.className = "generation-more";
      if (generationsOpen) more.open = true;
      more.addEventListener("toggle", () => { generationsOpen = more.open; });
      const summary = document.createElement("summary");
      summary.textContent = (earlier.length - GENERATION_LINES) + " earlier generation(s)";
      more.appendChild(summary);
      const rest = document.createElement("ul");
      rest.className = "generation-lines";
      earlier.slice(GENERATION_LINES).forEach((g) => rest.appendChild(line(g)));
      more.appendChild(rest);
      node.appendChild(more);
    }
  }

  function drawGeneration(g) {
    const box = document.createElement("figure");
    box.className = "generation" + (g.current ? " current" : "");
    const cap = document.createElement("figcaption");
    cap.textContent = "Generation " + g.number + (g.current ? " (current)" : "") + (g.reason ? " – " + g.reason : "") +
      " · " + when(g.created_at) + (g.changes && g.changes.length ? " · " + g.changes.join("; ") : "");
    box.appendChild(cap);
    const pipelines = [...new Set(g.cells.map((c) => c.pipeline))].sort((a, b) => a - b);
    const stages = [...new Set(g.cells.map((c) => c.stage))].sort((a, b) => a - b);
    const grid = document.createElement("table");
    grid.className = "layout";
    const head = grid.createTHead().insertRow();
    head.appendChild(document.createElement("th"));
    stages.forEach((s) => { const th = document.createElement("th"); th.scope = "col"; th.textContent = "stage " + s; head.appendChild(th); });
    const tb = grid.createTBody();
    const rerouteFrom = new Set(g.reroutes.map((r) => r.from));
    const rerouteTo = new Set(g.reroutes.map((r) => r.to));
    pipelines.forEach((p) => {
      const tr = tb.insertRow();
      const th = document.createElement("th");
      th.scope = "row";
      th.textContent = "pipeline " + p;
      tr.appendChild(th);
      stages.forEach((s) => {
        const td = tr.insertCell();
        g.cells.filter((c) => c.pipeline === p && c.stage === s).forEach((c) => {
          const div = document.createElement("div");
          div.className = "node" + (c.failed || c.left ? " failed" : "") + (rerouteTo.has(c.instance) ? " reroute" : "");
          div.textContent = c.label + (c.instance_type ? " · " + c.instance_type : "");
          const notes = [];
          if (c.failed) notes.push("failed (" + c.state + ")"); else if (c.left) notes.push("left");
          if (rerouteFrom.has(c.instance)) notes.push("work re-routed away");
          if (rerouteTo.has(c.instance)) notes.push("takes re-routed work");
          if (notes.length) { const small = document.createElement("small"); small.textContent = notes.join(", "); div.appendChild(small); }
          td.appendChild(div);
        });
      });
    });
    box.appendChild(grid);
    if (g.reroutes.length) {
      const ul = document.createElement("ul");
      ul.className = "reroutes";
      g.reroutes.forEach((r) => {
        const li = document.createElement("li");
        li.textContent = "re-routed " + (r.micro_batches ? r.micro_batches + " micro-batches " : "") + "from instance " + r.from + " to instance " + r.to;
        ul.appendChild(li);
      });
      box.appendChild(ul);
    }
    return box;
  }

  function renderJob(d) {
    const j = d.job;
    const c = d.curves;
    setText("job-status", j.status);
    setText("kpi-progress", pct(j.target_steps ? j.steps_done / j.target_steps : 0));
    setText("kpi-steps", j.steps_done + " of " + j.target_steps + " steps · generation " + j.current_generation);
    const lastThroughput = c.samples_per_s.filter((v) => v !== null).slice(-1)[0];
    setText("kpi-throughput", lastThroughput === undefined ? "–" : lastThroughput.toFixed(1));
    setText("kpi-cost", money(d.cost.total));
    setText("kpi-budget", (d.cost.budget ? "of " + money(d.cost.budget) + " budget" : "no budget set") +
      (d.cost.projected_at_finish !== null ? "; about " + money(d.cost.projected_at_finish) + " at the predicted finish" : ""));
    const split = d.cost.by_capacity_type;
    setText("kpi-capacity-split", "spot " + split.spot.hours + " h, " + money(split.spot.cost_usd) +
      " · on-demand " + split.on_demand.hours + " h, " + money(split.on_demand.cost_usd));
    setText("job-capacity-type", j.capacity_type);
    // The policy may give up on the deadline while the page is open: show the warning then.
    const unreachable = el("deadline-unreachable");
    if (unreachable) unreachable.hidden = !j.deadline_unreachable_at;
    if (j.deadline_unreachable_at) setText("deadline-unreachable-at", when(j.deadline_unreachable_at).slice(0, 16));
    setText("kpi-finish", d.prediction.predicted_finish ? when(d.prediction.predicted_finish) : "–");
    setText("kpi-deadline", d.prediction.deadline ? "deadline " + when(d.prediction.deadline) +
      (d.prediction.on_time === false ? " (late!)" : d.prediction.on_time ? " (on time)" : "") : "no deadline");
    const emptyNote = el("empty-metrics");
    if (emptyNote) emptyNote.hidden = c.step.length > 0;
    const suffix = c.stride > 1 ? " (every " + c.stride + "th step)" : "";
    // Training loss, and the validation loss (config.val_every) as a second trace with markers.
    const lossTraces = c.step.length ? [{ type: "scatter", mode: "lines", name: "training loss" + suffix, x: c.step, y: c.loss, line: { color: COLORS[1] } }] : [];
    const valPoints = (c.val_step || []).length;
    if (valPoints) {
      lossTraces.push({ type: "scatter", mode: "lines+markers", name: "validation loss", x: c.val_step, y: c.val_loss,
        line: { color: COLORS[2], dash: "dot" }, marker: { size: 7, color: COLORS[2] } });
    }
    plot("chart-loss", lossTraces,
      { xaxis: { title: { text: "step" } }, yaxis: { title: { text: "loss" } }, showlegend: valPoints > 0,
        legend: { orientation: "h", y: 1.12 }, uirevision: "loss" }, "No loss reported yet.");
    plot("chart-throughput", c.step.length ? [{ type: "scatter", mode: "lines", name: "samples/s" + suffix, x: c.step, y: c.samples_per_s, line: { color: COLORS[0] } }] : [],
      { xaxis: { title: { text: "step" } }, yaxis: { title: { text: "samples/s" }, rangemode: "tozero" }, showlegend: false, uirevision: "tp" },
      "No throughput reported yet.");
    const costTraces = d.cost.x.length ? [{ type: "scatter", mode: "lines", name: "spent", x: d.cost.x, y: d.cost.spent, fill: "tozeroy", line: { color: COLORS[0] } }] : [];
    if (costTraces.length && d.cost.projected_at_finish !== null && d.prediction.predicted_finish) {
      costTraces.push({ type: "scatter", mode: "lines", name: "projected to finish at " + money(d.cost.rate_per_hour) + "/h",
        x: [d.cost.x[d.cost.x.length - 1], d.prediction.predicted_finish],
        y: [d.cost.spent[d.cost.spent.length - 1], d.cost.projected_at_finish], line: { dash: "dot", color: COLORS[0] } });
    }
    if (costTraces.length && d.cost.budget) {
      costTraces.push({ type: "scatter", mode: "lines", name: "budget", x: [d.cost.x[0], d.cost.x[d.cost.x.length - 1]],
        y: [d.cost.budget, d.cost.budget], line: { dash: "dash", color: COLORS[1] } });
      const lastX = d.prediction.predicted_finish && d.cost.projected_at_finish !== null ? d.prediction.predicted_finish : null;
      if (lastX) costTraces[costTraces.length - 1].x[1] = lastX;
    }
    plot("chart-cost", costTraces, { yaxis: { title: { text: "USD" }, rangemode: "tozero" }, uirevision: "cost" },
      "No cost yet: the job has not run on any node.");
    const progress = c.step.length ? [{ type: "scatter", mode: "lines", name: "steps", x: c.at, y: c.step, line: { color: COLORS[2] } }] : [];
    const shapes = [];
    if (progress.length && d.prediction.predicted_finish && d.prediction.steps_done < d.prediction.target_steps) {
      progress.push({ type: "scatter", mode: "lines", name: "predicted", x: [c.at[c.at.length - 1], d.prediction.predicted_finish],
        y: [c.step[c.step.length - 1], d.prediction.target_steps], line: { dash: "dot", color: COLORS[2] } });
    }
    if (progress.length && d.prediction.deadline) {
      shapes.push({ type: "line", xref: "x", yref: "paper", x0: d.prediction.deadline, x1: d.prediction.deadline, y0: 0, y1: 1,
        line: { color: COLORS[1], dash: "dash" } });
    }
    plot("chart-progress", progress, { shapes, yaxis: { title: { text: "steps" }, rangemode: "tozero" }, uirevision: "progress" },
      "No progress yet.");
    plot("chart-reconf", d.reconfigurations.length ? [{ type: "scatter", mode: "markers+text", x: d.reconfigurations.map((r) => r.decided_at),
      y: d.reconfigurations.map((r) => r.trigger), text: d.reconfigurations.map((r) => r.decision || ""), textposition: "top center", cliponaxis: false,
      marker: { size: 11, color: d.reconfigurations.map((r) => (r.status === "failed" ? "#dc2626" : "#2563eb")) } }] : [],
    { showlegend: false, margin: { l: 90, r: 30, t: 30, b: 30 }, yaxis: { automargin: true } }, "No reconfigurations: no node has left or joined this job.");
    table("table-reconf", [
      { label: "Decided", value: (r) => when(r.decided_at).slice(5) },
      { label: "Trigger", value: (r) => r.trigger },
      { label: "Decision", value: (r) => r.decision },
      { label: "Instance", value: (r) => r.instance__provider_instance_id },
      { label: "Generations", value: (r) => text(r.from_generation) + " → " + text(r.to_generation) },
      { label: "Status", value: (r) => r.status },
      { label: "Lost s", value: (r) => r.lost_seconds.toFixed(1), num: true },
    ], d.reconfigurations.slice(-RECONF_ROWS).reverse(), "");
    setText("reconf-more", d.reconfigurations.length > RECONF_ROWS ? "Newest " + RECONF_ROWS + " of " +
      d.reconfigurations.length + "; all on the chart and at /api/v1/jobs/" + d.job.id + "/reconfigurations/." : "");
    renderLayouts(d.layouts);
    renderEvents(d.events);
  }

  // The timeline: one page of events (newest first), of one kind or all; the page and the kind are
  // sent with every poll, so the refresh keeps what the user chose.
  const jobEvents = { page: 1, kind: "" };

  function jobURL() {
    const params = new URLSearchParams();
    if (jobEvents.page > 1) params.set("events_page", String(jobEvents.page));
    if (jobEvents.kind) params.set("events_kind", jobEvents.kind);
    return endpoint + (params.toString() ? "?" + params.toString() : "");
  }

  function renderEvents(ev) {
    // An answer to an earlier request (a poll sent before the user paged or filtered) is not drawn.
    if (ev.kind !== jobEvents.kind || (ev.page !== jobEvents.page && ev.pages >= jobEvents.page)) return;
    jobEvents.page = ev.page; // the server gives the last page when the asked one is past the end
    const select = el("events-kind");
    if (select) {
      const wanted = [""].concat(ev.kinds.map((k) => k.kind));
      const have = Array.from(select.options).map((o) => o.value);
      if (wanted.join("\n") !== have.join("\n")) {
        select.innerHTML = "";
        const total = ev.kinds.reduce((n, k) => n + k.count, 0);
        select.appendChild(new Option("all kinds (" + total + ")", ""));
        ev.kinds.forEach((k) => select.appendChild(new Option(k.kind + " (" + k.count + ")", k.kind)));
      }
      select.value = ev.kind;
    }
    setText("events-pager", ev.count ? "· page " + ev.page + " of " + ev.pages + " · " + ev.count + " event(s), newest first" : "");
    const newer = el("events-newer");
    const older = el("events-older");
    if (newer) newer.disabled = ev.page <= 1;
    if (older) older.disabled = ev.page >= ev.pages;
    table("table-events", [
      { label: "When", value: (e) => when(e.at) }, { label: "Event", value: (e) => e.kind }, { label: "Message", value: (e) => e.message },
    ], ev.rows, ev.kind ? "No " + ev.kind + " events." : "Nothing has happened to this job yet.");
  }

  function bindEventControls() {
    const select = el("events-kind");
    if (select) select.addEventListener("change", () => { jobEvents.kind = select.value; jobEvents.page = 1; refresh(jobURL()); });
    const newer = el("events-newer");
    if (newer) newer.addEventListener("click", () => { jobEvents.page = Math.max(1, jobEvents.page - 1); refresh(jobURL()); });
    const older = el("events-older");
    if (older) older.addEventListener("click", () => { jobEvents.page += 1; refresh(jobURL()); });
  }

  function renderNotices(d) {
    const sources = d.processing;
    plot("chart-processing", sources.map((s, i) => ({ type: "scatter", mode: "markers", name: s.name, x: s.x, y: s.y, marker: { color: COLORS[i % COLORS.length] } })),
      { yaxis: { title: { text: "ms from received to processed" }, rangemode: "tozero" } },
      "No processed notices yet. Notices arrive from the cloud webhooks (/api/v1/webhooks/<source>/) and node agents.");
    table("table-notices", [
      { label: "Received", value: (n) => when(n.received_at) },
      { label: "Source", value: (n) => n.source },
      { label: "Kind", value: (n) => n.kind },
      { label: "Instance", value: (n) => n.provider_instance_id + (n.unknown_instance ? " (unknown)" : "") },
      { label: "Status", value: (n) => n.status },
      { label: "Processing ms", value: (n) => n.processing_ms, num: true },
      { label: "Attempts", value: (n) => n.attempts, num: true },
      { label: "Error", value: (n) => n.error },
      { label: "Actions", value: (n) => actionButton(n.retry_url, "Retry", { title: "Retry notice " + n.id }) },
    ], d.rows, "No notices yet. Configure your cloud to send interruption events to the webhooks; see the API docs.");
  }

  function renderCost() {
    const script = el("cost-pools");
    if (!script) return;
    const pools = JSON.parse(script.textContent);
    const labels = pools.map((l) => l.instance_type + " " + l.zone);
    plot("chart-cost-pools", pools.length ? [
      { type: "bar", name: "spot cost", x: labels, y: pools.map((l) => Number(l.cost_usd)), marker: { color: COLORS[0] } },
      { type: "bar", name: "on-demand equivalent", x: labels, y: pools.map((l) => Number(l.on_demand_cost_usd)), marker: { color: "#94a3b8" } },
    ] : [], { barmode: "group", yaxis: { title: { text: "USD" } } }, "No billed capacity yet.");
  }

  const RENDERERS = { overview: renderOverview, prices: renderPrices, fleet: renderFleet, jobs: renderJobs, job: renderJob, notices: renderNotices };

  function pricesURL() {
    const select = el("pool-select");
    const params = new URLSearchParams();
    if (select) Array.from(select.selectedOptions).forEach((o) => params.append("pool", o.value));
    const days = el("days-select");
    if (days) params.set("days", days.value);
    return endpoint + (params.toString() ? "?" + params.toString() : "");
  }

  async function refresh(url) {
    const render = RENDERERS[page];
    try {
      const data = await fetchJSON(url || endpoint);
      render(data);
      body.dataset.loaded = String(Date.now());
    } catch (error) {
      const main = el("main");
      let banner = el("load-error");
      if (!banner) {
        banner = document.createElement("p");
        banner.id = "load-error";
        banner.className = "error";
        banner.setAttribute("role", "alert");
        main.prepend(banner);
      }
      banner.textContent = "Could not load the data (" + error.message + "). Retrying shortly.";
      return;
    }
    const banner = el("load-error");
    if (banner) banner.remove();
  }

  if (page === "cost") { renderCost(); body.dataset.loaded = String(Date.now()); return; }
  if (!RENDERERS[page] || !endpoint) return;
  if (page === "prices") {
    el("price-controls").addEventListener("submit", (event) => { event.preventDefault(); refresh(pricesURL()); });
  }
  if (page === "job") bindEventControls();
  const current = () => (page === "job" ? jobURL() : undefined);
  refresh(current());
  // ?poll=<ms> overrides the interval (tests, wall displays); never faster than twice a second.
  const asked = Number(new URLSearchParams(window.location.search).get("poll"));
  const every = asked > 0 ? Math.max(asked, 500) : POLL_MS[page] || 0;
  if (every) {
    setInterval(() => { if (!document.hidden) refresh(current()); }, every);
  }
})();
