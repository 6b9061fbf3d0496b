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
  var keys = heads.map(function (th) { return th.getAttribute("data-key"); });
  var chooser = document.getElementById("cols");
  var boxes = chooser ? Array.prototype.slice.call(
    chooser.querySelectorAll("input[type=checkbox]")) : [];
  var reset = document.getElementById("cols-default");
  var sortKey = "", sortDir = 1;
  function visible() {
    return keys.filter(function (k, i) { return !heads[i].hidden; });
  }
  var defaults = visible();
  function value(row, col, num) {
    var cell = row.cells[col], v = cell.getAttribute(num ? "data-v" : "data-s");
    if (num) {
      var x = v === null ? NaN : parseFloat(v);
      return isNaN(x) ? -Infinity : x;
    }
    return (v === null ? cell.textContent : v).toLowerCase();
  }
  function sortBy(key, dir) {
    var col = keys.indexOf(key);
    if (col < 0) return;
    var num = heads[col].getAttribute("data-type") === "num";
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
  /* Show the columns named in list (the job's always), hide the others. */
  function showColumns(list) {
    var want = Object.create(null);
    list.forEach(function (k) { want[k] = true; });
    want.job_id = true;
    if (keys.every(function (k, i) { return heads[i].hidden === !want[k]; }))
      return;
    keys.forEach(function (k, i) {
      var hide = !want[k];
      heads[i].hidden = hide;
      rows.forEach(function (r) { r.cells[i].hidden = hide; });
    });
    boxes.forEach(function (b) { b.checked = want[b.value] === true; });
  }
  function filter() {
    var text = q.value.toLowerCase(), status = st.value, n = 0;
    rows.forEach(function (r) {
      var all = r.textContent + "\n" + (r.getAttribute("data-id") || "");
      var ok = (!status || r.getAttribute("data-status") === status) &&
        (!text || all.toLowerCase().indexOf(text) >= 0);
      r.hidden = !ok;
      if (ok) n++;
    });
    shown.textContent = String(n);
  }
  function save() {
    var parts = [], cols = visible();
    if (q.value) parts.push("q=" + encodeURIComponent(q.value));
    if (st.value) parts.push("status=" + encodeURIComponent(st.value));
    if (sortKey) parts.push("sort=" + encodeURIComponent(sortKey),
                            "dir=" + (sortDir > 0 ? "asc" : "desc"));
    if (cols.join(",") !== defaults.join(","))
      parts.push("cols=" + cols.map(encodeURIComponent).join(","));
    try {
      history.replaceState(null, "", "#" + parts.join("&"));
    } catch (e) { /* some browsers refuse it on file: pages */ }
  }
  function decode(s) {
    try {
      return decodeURIComponent(s);
    } catch (e) { /* a malformed escape: ignore that part */ }
    return null;
  }
  function load() {
    var hash = location.hash.replace(/^#/, ""), p = Object.create(null);
    /* a link to a section of the page, not a view */
    if (hash && hash.indexOf("=") < 0) return;
    hash.split("&").forEach(function (kv) {
      var i = kv.indexOf("=");
      if (i > 0) p[kv.slice(0, i)] = kv.slice(i + 1);
    });
    q.value = typeof p.q === "string" ? decode(p.q) || "" : "";
    st.value = "";
    var status = typeof p.status === "string" ? decode(p.status) : null;
    Array.prototype.forEach.call(st.options, function (o) {
      if (o.value === status) st.value = o.value;
    });
    showColumns(typeof p.cols === "string" ?
      p.cols.split(",").map(decode).filter(function (k) {
        return k !== null && keys.indexOf(k) >= 0;
      }) : defaults);
    if (typeof p.sort === "string")
      sortBy(decode(p.sort), p.dir === "desc" ? -1 : 1);
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
  boxes.forEach(function (b) {
    b.addEventListener("change", function () {
      var cols = visible().filter(function (k) { return k !== b.value; });
      if (b.checked) cols.push(b.value);
      /* in the table's order, whatever the order of the clicks */
      showColumns(keys.filter(function (k) { return cols.indexOf(k) >= 0; }));
      save();
    });
  });
  if (reset) {
    reset.addEventListener("click", function () {
      showColumns(defaults);
      save();
    });
  }
  q.addEventListener("input", function () { filter(); save(); });
  st.addEventListener("change", function () { filter(); save(); });
  window.addEventListener("hashchange", load);
  load();
  var styled = getComputedStyle(document.documentElement)
    .getPropertyValue("--cq-styled").trim() === "1";
  document.documentElement.setAttribute("data-report",
                                        styled ? "ready" : "unstyled");
})();
