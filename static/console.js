// Lazarus console behaviour. No inline scripts anywhere (the CSP forbids them): charts read their
// data from <script type="application/json"> blocks written by Django's json_script filter, which
// the browser never executes.
(function () {
  "use strict";

  var PALETTE = ["#0b5cad", "#b42318", "#067647", "#b54708", "#6941c6", "#0e7090", "#c11574", "#475467"];

  function renderCharts(root) {
    if (typeof window.Chart === "undefined") return;
    root.querySelectorAll("canvas[data-chart]").forEach(function (canvas) {
      if (canvas.dataset.rendered) return;
      var source = document.getElementById(canvas.dataset.chart);
      if (!source) return;
      var data = JSON.parse(source.textContent);
      var type = canvas.dataset.chartType || data.type || "bar";
      var stacked = canvas.dataset.stacked === "true";
      data.datasets.forEach(function (set, i) {
        var colour = PALETTE[i % PALETTE.length];
        set.backgroundColor = colour;
        set.borderColor = colour;
        set.spanGaps = true;
      });
      new window.Chart(canvas, {
        type: type,
        data: { labels: data.labels, datasets: data.datasets },
        options: {
          animation: false,
          responsive: true,
          maintainAspectRatio: false,
          scales: {
            x: { stacked: stacked },
            y: { stacked: stacked, beginAtZero: true, ticks: { precision: 0 } },
          },
          plugins: { legend: { position: "bottom" } },
        },
      });
      canvas.dataset.rendered = "1";
    });
  }

  // "Select all on this page" for the message list's bulk actions.
  document.addEventListener("change", function (event) {
    var box = event.target;
    if (!box.matches) return;
    if (box.matches("input[data-select-all]")) {
      var form = box.closest("form") || document;
      form.querySelectorAll('input[type="checkbox"][name="' + box.dataset.selectAll + '"]').forEach(
        function (other) { other.checked = box.checked; }
      );
    }
    if (box.matches('input[type="checkbox"]')) updateSelection(document);
  });

  // Bulk buttons stay disabled until something is selected, and the bar says how many (without
  // JavaScript they are enabled, and the server refuses an empty selection).
  function updateSelection(root) {
    root.querySelectorAll("[data-needs-selection]").forEach(function (button) {
      var form = button.closest("form") || document;
      var name = button.dataset.needsSelection;
      var n = form.querySelectorAll('input[type="checkbox"][name="' + name + '"]:checked').length;
      button.disabled = n === 0;
      button.title = n === 0 ? "Select messages first" : "";
    });
    root.querySelectorAll("[data-count-of]").forEach(function (counter) {
      var form = counter.closest("form") || document;
      var name = counter.dataset.countOf;
      counter.textContent = String(
        form.querySelectorAll('input[type="checkbox"][name="' + name + '"]:checked').length
      );
    });
  }

  // Destructive buttons ask first (without JavaScript they simply submit).
  document.addEventListener("click", function (event) {
    var button = event.target.closest && event.target.closest("button[data-confirm]");
    if (button && !window.confirm(button.dataset.confirm)) event.preventDefault();
  }, true);

  // On a phone the navigation and the filters start closed (they are open without JavaScript).
  function collapseOnPhones() {
    if (!window.matchMedia("(max-width: 600px)").matches) return;
    document.querySelectorAll("details.collapsible[open]").forEach(function (d) {
      d.removeAttribute("open");
    });
  }

  // j / k: the next / previous row of a list (its first link, the row's one tab stop); Enter
  // opens it. Not while typing in a field.
  document.addEventListener("keydown", function (event) {
    if (event.key !== "j" && event.key !== "k") return;
    if (event.ctrlKey || event.metaKey || event.altKey) return;
    var target = event.target;
    if (target.closest && target.closest("input, textarea, select, [contenteditable]")) return;
    var links = Array.prototype.slice.call(document.querySelectorAll("a[data-row-link]"));
    if (!links.length) return;
    var at = links.indexOf(document.activeElement);
    var next = event.key === "j" ? Math.min(at + 1, links.length - 1) : Math.max(at - 1, 0);
    if (at === -1) next = 0;
    document.querySelectorAll("tr.row-focus").forEach(function (tr) { tr.classList.remove("row-focus"); });
    links[next].focus();
    var row = links[next].closest("tr");
    if (row) {
      row.classList.add("row-focus");
      row.scrollIntoView({ block: "nearest" });
    }
    event.preventDefault();
  });

  // A wide table on a narrow screen scrolls sideways: make it a tab stop, so a keyboard can
  // scroll it too (WCAG 2.1.1), named after the heading above it.
  function focusableScrollers(root) {
    root.querySelectorAll("table:not(.cards)").forEach(function (table) {
      if (table.scrollWidth <= table.clientWidth) {
        if (table.dataset.scroller) {
          table.removeAttribute("tabindex");
          delete table.dataset.scroller;
        }
        return;
      }
      if (table.hasAttribute("tabindex")) return;
      table.setAttribute("tabindex", "0");
      table.dataset.scroller = "1";
      if (!table.getAttribute("aria-label")) {
        var heading = table.closest("section, div, details");
        heading = heading && heading.querySelector("h2, h3, summary");
        table.setAttribute("aria-label", (heading ? heading.textContent.trim() + ": " : "") + "table, scrolls sideways");
      }
    });
  }

  document.addEventListener("DOMContentLoaded", function () {
    collapseOnPhones();
    renderCharts(document);
    updateSelection(document);
    focusableScrollers(document);
  });
  document.addEventListener("htmx:load", function (event) {
    renderCharts(event.target);
    updateSelection(document);
    focusableScrollers(document);
  });
  window.addEventListener("resize", function () { focusableScrollers(document); });
})();
