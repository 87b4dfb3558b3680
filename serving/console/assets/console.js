// The operator console (docs/console.md): reads /console/api/* every REFRESH_MS and draws it with the
// DOM only (textContent, never markup from data) and uPlot. No build step: this file is what runs.
// Credentials: the browser's HTTP Basic ones for this origin, which fetch sends by itself.

const REFRESH_MS = 5000;
const main = document.getElementById("main");
const crumb = document.getElementById("crumb");
const clock = document.getElementById("clock");
const charts = new Map(); // chart id -> {plot, box}
let timer = null;
let view = null; // what the page shows: {kind: "overview"} or {kind: "endpoint", name}

// --- small DOM helpers -------------------------------------------------------------------------
function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs)) {
    if (value === undefined || value === null) continue;
    if (key === "class") node.className = value;
    else if (key === "text") node.textContent = value;
    else node.setAttribute(key, value);
  }
  for (const child of children) {
    if (child === null || child === undefined) continue;
    node.append(child instanceof Node ? child : String(child));
  }
  return node;
}

function status(value) {
  return el("span", { class: `status status-${value}`, text: value ?? "—" });
}

function table(headings, rows, numeric = []) {
  const head = el("tr", {}, ...headings.map((h) => el("th", { text: h })));
  const body = rows.map((cells) =>
    el("tr", {}, ...cells.map((cell, i) => el("td", { class: numeric.includes(i) ? "num" : null }, cell))));
  return el("table", {}, el("thead", {}, head), el("tbody", {}, ...body));
}

function when(seconds) {
  return seconds ? new Date(seconds * 1000).toLocaleTimeString() : "—";
}

function number(value, digits = 2) {
  return value === null || value === undefined ? "—" : Number(value).toFixed(digits);
}

async function read(path) {
  const answer = await fetch(path, { headers: { accept: "application/json" }, credentials: "same-origin" });
  const body = await answer.json().catch(() => ({}));
  if (!answer.ok) throw new Error(`${answer.status} ${body.__type ?? ""}: ${body.message ?? answer.statusText}`);
  return body;
}

// --- the overview ------------------------------------------------------------------------------
function overview(document_) {
  const rows = document_.Endpoints.map((e) => [
    el("a", { href: `#/endpoints/${encodeURIComponent(e.EndpointName)}`, text: e.EndpointName }),
    status(e.EndpointStatus),
    e.Variants.map((v) => `${v.VariantName} ${number(v.CurrentWeight)}`).join(", "),
    String(e.Shadows),
    e.DataCapture ? "on" : "off",
    e.Updating ? "in progress" : "—",
    String(e.Containers),
    `${e.ReplicasRunning} / ${e.ReplicasDesired}`,
    e.FailureReason ? el("span", { class: "failure", text: e.FailureReason }) : "",
  ]);
  return el("section", { id: "overview" },
    el("h2", { text: `Endpoints (${document_.Endpoints.length})` }),
    table(["Endpoint", "Status", "Variants (weight)", "Shadows", "Capture", "Update", "Containers",
      "Replicas running / desired", "Failure"], rows, [3, 6, 7]),
    alarms(document_.Alarms));
}

function alarms(list) {
  const rows = list.map((a) => [a.AlarmName, status(a.StateValue), a.MetricName ?? "",
    `${a.ComparisonOperator ?? ""} ${a.Threshold ?? ""}`, (a.Dimensions ?? []).map((d) => `${d.Name}=${d.Value}`).join(" "),
    a.StateReason ?? "", when(a.StateUpdatedTimestamp)]);
  return el("section", { id: "alarms" }, el("h2", { text: `Alarms (${list.length})` }),
    list.length ? table(["Alarm", "State", "Metric", "Condition", "Dimensions", "Reason", "Since"], rows)
      : el("p", { class: "muted", text: "No alarms." }));
}

// --- one endpoint ------------------------------------------------------------------------------
function update(endpoint) {
  const pending = endpoint.PendingDeploymentSummary;
  const config = endpoint.LastDeploymentConfig;
  const parts = [];
  if (pending) {
    parts.push(el("p", {}, "Update to ", el("code", { text: pending.EndpointConfigName }), ` since ${when(pending.StartTime)}`));
    const steps = (pending.ProductionVariants ?? []).map((v) => [v.VariantName,
      ...(v.VariantStatus ?? []).map((s) => el("span", {}, status(s.Status), " ", s.StatusMessage ?? "")),
      number(v.CurrentWeight), number(v.DesiredWeight)]);
    parts.push(table(["New variant", "Step", "Current weight", "Desired weight"], steps, [2, 3]));
  }
  if (config) {
    const routing = config.BlueGreenUpdatePolicy?.TrafficRoutingConfiguration ?? {};
    const size = routing.CanarySize ?? routing.LinearStepSize;
    parts.push(el("p", { class: "muted", text: `Traffic shifting: ${routing.Type ?? "ALL_AT_ONCE"}` +
      (size ? ` ${size.Value} ${size.Type}` : "") + (routing.WaitIntervalInSeconds ? `, bake ${routing.WaitIntervalInSeconds} s` : "") +
      `; rollback alarms: ${(config.AutoRollbackConfiguration?.Alarms ?? []).map((a) => a.AlarmName).join(", ") || "none"}` }));
  }
  if (endpoint.FailureReason) parts.push(el("p", { class: "failure", text: endpoint.FailureReason }));
  return parts.length ? el("section", { id: "update" }, el("h2", { text: "Update" }), el("div", { class: "panel" }, ...parts)) : null;
}

function variants(endpoint) {
  const row = (v, shadow) => [v.VariantName, shadow ? "shadow" : "production", number(v.CurrentWeight), number(v.DesiredWeight),
    `${v.CurrentInstanceCount} / ${v.DesiredInstanceCount}`, (v.DeployedImages ?? []).map((i) => i.ResolvedImage).join(", ")];
  const rows = [...(endpoint.ProductionVariants ?? []).map((v) => row(v, false)),
    ...(endpoint.ShadowProductionVariants ?? []).map((v) => row(v, true))];
  const capture = endpoint.DataCaptureConfig;
  return el("section", { id: "variants" }, el("h2", { text: "Variants" }),
    table(["Variant", "Kind", "Current weight", "Desired weight", "Instances", "Images"], rows, [2, 3]),
    el("p", { class: "muted", text: capture ? `Data capture: ${capture.EnableCapture ? "on" : "off"}, ${capture.CurrentSamplingPercentage ?? "?"} % sampled, status ${capture.CaptureStatus ?? "?"}` : "Data capture: off" }));
}

function containers(fleet) {
  const rows = fleet.Containers.map((c) => {
    const metric = c.ScalingMetric;
    return [c.ContainerHostname, c.Image, c.Mode, c.Version ?? "", status(c.Status),
      `${c.Replicas?.Running ?? c.CurrentReplicas} / ${c.Replicas?.Starting ?? 0}`, String(c.DesiredReplicas),
      metric ? `${metric.MetricName ?? ""} ${number(metric.MetricValue)} / ${number(metric.TargetValue)}` : "fixed",
      c.LastFailureReason || c.FailureReason ? el("span", { class: "failure", text: c.FailureReason ?? c.LastFailureReason }) : ""];
  });
  const activities = fleet.ScalingActivities.map((a) => [when(Date.parse(a.Time) / 1000 || a.Time), a.ContainerHostname,
    `${a.From} → ${a.To}`, number(a.MetricValue), a.Reason ?? ""]);
  return el("section", { class: "fleet" },
    el("h3", {}, `${fleet.VariantName} (${fleet.Fleet}${fleet.Shadow ? ", shadow" : ""}) `, status(fleet.EndpointStatus)),
    table(["Container", "Stack", "Mode", "Model version", "Status", "Running / starting", "Desired",
      "Scaling metric / target", "Last failure"], rows, [5, 6]),
    activities.length ? table(["Time", "Container", "Replicas", "Metric", "Reason"], activities, [3])
      : el("p", { class: "muted", text: "No scaling activity yet." }));
}

const LINES = [
  ["Invocations/s", [["InvocationsPerSecond", "invocations/s", "#0969da"]]],
  ["Model latency (ms)", [["ModelLatencyP50Ms", "p50", "#1a7f37"], ["ModelLatencyP99Ms", "p99", "#9a6700"]]],
  ["Errors/s", [["Invocation4XXPerSecond", "4XX", "#bf8700"], ["Invocation5XXPerSecond", "5XX", "#cf222e"]]],
  ["MultiModel cache (per s)", [["CacheHitsPerSecond", "hits", "#8250df"], ["ModelLoadsPerSecond", "loads", "#57606a"]]],
];

function chartId(chart, title) {
  const who = chart.Kind === "variant" ? chart.VariantName : `${chart.VariantName}/${chart.ContainerHostname}`;
  return `${chart.Kind}:${who}:${title}`;
}

function drawCharts(host, document_) {
  const seen = new Set();
  for (const chart of document_.Charts) {
    for (const [title, lines] of LINES) {
      const id = chartId(chart, title);
      seen.add(id);
      const data = [document_.Timestamps, ...lines.map(([key]) => chart.Series[key])];
      const points = lines.reduce((n, [key]) => n + chart.Series[key].filter((v) => v !== null).length, 0);
      let entry = charts.get(id);
      if (!entry) {
        const label = chart.Kind === "variant" ? `variant ${chart.VariantName}` : chart.ContainerHostname;
        const box = el("div", { class: "chart", "data-chart": id }, el("div", { class: "title", text: `${label}: ${title}` }));
        host.append(box);
        const plot = new uPlot({
          width: 300, height: 150, legend: { show: true },
          scales: { x: { time: true } },
          series: [{}, ...lines.map(([, label_, stroke]) => ({ label: label_, stroke, width: 1.5, spanGaps: false, points: { show: true, size: 4 } }))],
          axes: [{ size: 30 }, { size: 45 }],
        }, data, box);
        entry = { plot, box };
        charts.set(id, entry);
      } else {
        entry.plot.setData(data);
        if (!entry.box.isConnected) host.append(entry.box);
      }
      entry.box.dataset.points = String(points);
    }
  }
  for (const [id, entry] of charts) {
    if (!seen.has(id)) { entry.plot.destroy(); entry.box.remove(); charts.delete(id); }
  }
}

function endpointPage(document_) {
  const endpoint = document_.Endpoint;
  const tables = el("div", { id: "tables" },
    el("h2", {}, `${endpoint.EndpointName} `, status(endpoint.EndpointStatus)),
    update(endpoint), variants(endpoint),
    el("section", { id: "containers" }, el("h2", { text: "Containers" }), ...document_.Fleets.map(containers)),
    alarms(document_.Alarms));
  return tables;
}

// --- refresh loop ------------------------------------------------------------------------------
async function refresh() {
  try {
    if (view.kind === "overview") {
      const document_ = await read("/console/api/overview");
      main.replaceChildren(overview(document_));
      clock.textContent = `as of ${when(document_.Time)}`;
    } else {
      const document_ = await read(`/console/api/endpoints/${encodeURIComponent(view.name)}`);
      let host = document.getElementById("charts");
      if (!host || !main.contains(host)) {
        host = el("div", { class: "charts", id: "charts" });
        main.replaceChildren(el("div", { id: "tables" }), el("h2", { text: "Charts (last hour)" }), host);
      }
      document.getElementById("tables").replaceWith(endpointPage(document_));
      drawCharts(host, document_);
      clock.textContent = `as of ${when(document_.Time)}`;
    }
    main.dataset.loaded = "true";
  } catch (error) {
    main.replaceChildren(el("p", { class: "error", id: "error", text: String(error.message ?? error) }));
    for (const entry of charts.values()) entry.plot.destroy();
    charts.clear();
  }
}

function route() {
  const match = location.hash.match(/^#\/endpoints\/(.+)$/);
  view = match ? { kind: "endpoint", name: decodeURIComponent(match[1]) } : { kind: "overview" };
  crumb.replaceChildren(view.kind === "endpoint" ? el("span", { text: `/ ${view.name}` }) : "");
  for (const entry of charts.values()) entry.plot.destroy();
  charts.clear();
  main.replaceChildren(el("p", { class: "muted", text: "Loading…" }));
  delete main.dataset.loaded;
  clearInterval(timer);
  refresh();
  timer = setInterval(refresh, REFRESH_MS);
}

window.addEventListener("hashchange", route);
route();
