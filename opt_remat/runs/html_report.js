// opt-remat's HTML report: draws the figures from the embedded data (html_page.page_data) and
// builds the live-memory hover texts from the compact curve data: per step the value computed and
// the largest live buffers, as indices into the value table.
(function () {
  "use strict";
  var errors = document.getElementById("errors");
  window.addEventListener("error", function (e) { errors.textContent += "error: " + e.message + "\n"; });
  var data = JSON.parse(document.getElementById("report-data").textContent);
  var values = data.values; // [name, op, module, role, storage bytes]

  function fmtBytes(n) { // solvers.budget.format_bytes's rule
    var units = [["TiB", 1099511627776], ["GiB", 1073741824], ["MiB", 1048576], ["KiB", 1024]];
    for (var i = 0; i < units.length; i++) {
      if (Math.abs(n) >= units[i][1]) { return (n / units[i][1]).toFixed(2) + " " + units[i][0]; }
    }
    return Math.round(n) + " B";
  }

  function esc(s) {
    return String(s).replace(/&/g, "&amp;").replace(/</g, "&lt;").replace(/>/g, "&gt;");
  }

  var KIND = { f: "forward", b: "backward", r: "backward, recomputing" };

  function stepText(curve, i) {
    var v = values[curve.values[i]];
    var lines = ["step " + i + " (" + KIND[curve.kinds[i]] + ")",
      "op <b>" + esc(v[1]) + "</b> computes " + esc(v[0]) + (v[2] ? " in " + esc(v[2]) : ""),
      "live " + fmtBytes(curve.live_bytes[i]) + " in " + curve.live_count[i] + " buffer(s)" +
        (curve.live_bytes[i] === curve.peak ? ": the peak" : "") + ":"];
    var shown = 0;
    curve.top[i].forEach(function (entry) {
      var u = values[entry[0]];
      shown += u[4];
      lines.push("  " + fmtBytes(u[4]) + "  " + esc(u[0]) + " (" + esc(u[1]) + ", " + data.tags[entry[1]] + ")");
    });
    var rest = curve.live_count[i] - curve.top[i].length;
    if (rest > 0) { lines.push("  + " + rest + " more, " + fmtBytes(curve.live_bytes[i] - shown)); }
    return lines.join("<br>");
  }

  data.figures.forEach(function (fig) {
    fig.data.forEach(function (trace) {
      if (trace.meta && trace.meta.curve !== undefined) {
        var curve = data.curves[trace.meta.curve];
        trace.text = curve.values.map(function (_, i) { return stepText(curve, i); });
      }
    });
    Plotly.newPlot(fig.id, fig.data, fig.layout, { responsive: true, displaylogo: false });
  });

  var choice = document.getElementById("plan-choice");
  if (choice) {
    choice.addEventListener("change", function () {
      document.querySelectorAll(".breakdown").forEach(function (panel) {
        panel.hidden = panel.getAttribute("data-plan") !== choice.value;
      });
    });
  }
  document.body.setAttribute("data-drawn", "true");
})();
