(function () {
  "use strict";
  var table = document.getElementById("jobs");
  var q = document.getElementById("q");
  var st = document.getElementById("status");
  var shown = document.getElementById("shown");
  if (!table || !q || !st || !shown) return;
  var body = table.tBodies[0];
  var rows = Array.prototype.slice.call(body.rows);
  var heads = Array.prototype.slice.call(table.tHead.rows[0].cells);
  var sortKey = "", sortDir = 1;
  function value(row, col, num) {
    var cell = row.cells[col], v = cell.getAttribute("data-v");
    if (num) {
      var x = v === null ? NaN : parseFloat(v);
      return isNaN(x) ? -Infinity : x;
    }
    return cell.textContent.toLowerCase();
  }
  function sortBy(key, dir) {
    var col = -1, num = false;
    heads.forEach(function (th, i) {
      if (th.getAttribute("data-key") === key) {
        col = i;
        num = th.getAttribute("data-type") === "num";
      }
    });
    if (col < 0) return;
    heads.forEach(function (th) { th.removeAttribute("aria-sort"); });
    sortKey = key;
    sortDir = dir;
    heads[col].setAttribute("aria-sort", dir > 0 ? "ascending" : "descending");
    var keyed = rows.map(function (r, i) {
      return { r: r, i: i, v: value(r, col, num) };
    });
    keyed.sort(function (a, b) {
      if (a.v < b.v) return -dir;
      if (a.v > b.v) return dir;
      return a.i - b.i;
    });
    keyed.forEach(function (k) { body.appendChild(k.r); });
  }
  function filter() {
    var text = q.value.toLowerCase(), status = st.value, n = 0;
    rows.forEach(function (r) {
      var ok = (!status || r.getAttribute("data-status") === status) &&
        (!text || r.textContent.toLowerCase().indexOf(text) >= 0);
      r.hidden = !ok;
      if (ok) n++;
    });
    shown.textContent = String(n);
  }
  function save() {
    var parts = [];
    if (q.value) parts.push("q=" + encodeURIComponent(q.value));
    if (st.value) parts.push("status=" + encodeURIComponent(st.value));
    if (sortKey) parts.push("sort=" + encodeURIComponent(sortKey),
                            "dir=" + (sortDir > 0 ? "asc" : "desc"));
    try {
      history.replaceState(null, "", "#" + parts.join("&"));
    } catch (e) { /* some browsers refuse it on file: pages */ }
  }
  function load() {
    var p = Object.create(null);
    location.hash.replace(/^#/, "").split("&").forEach(function (kv) {
      var i = kv.indexOf("=");
      if (i <= 0) return;
      try {
        p[kv.slice(0, i)] = decodeURIComponent(kv.slice(i + 1));
      } catch (e) { /* a malformed escape: ignore that part */ }
    });
    q.value = typeof p.q === "string" ? p.q : "";
    st.value = "";
    Array.prototype.forEach.call(st.options, function (o) {
      if (o.value === p.status) st.value = o.value;
    });
    if (typeof p.sort === "string") sortBy(p.sort, p.dir === "desc" ? -1 : 1);
    filter();
  }
  heads.forEach(function (th) {
    var b = th.querySelector("button");
    if (!b) return;
    b.addEventListener("click", function () {
      var k = th.getAttribute("data-key");
      sortBy(k, sortKey === k ? -sortDir : 1);
      save();
    });
  });
  q.addEventListener("input", function () { filter(); save(); });
  st.addEventListener("change", function () { filter(); save(); });
  window.addEventListener("hashchange", load);
  load();
  var styled = getComputedStyle(document.documentElement)
    .getPropertyValue("--cq-styled").trim() === "1";
  document.documentElement.setAttribute("data-report",
                                        styled ? "ready" : "unstyled");
})();
