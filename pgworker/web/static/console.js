/* pgworker console: progressive enhancement only. Every page works without this file.
   - live updates: a page with data-live="<SSE url>" fetches itself again on each
     "refresh" event and swaps its <main id="live">, unless the operator is typing in it,
     has typed into a field there and left it, has a <details> open there or is pressing
     a button (the refresh then runs once they are not); a page that comes back without
     data-live (its job finished) closes its stream;
   - forms with data-confirm="question" ask before submitting;
   - a checkbox with data-select-all ticks every ids checkbox. */
(function () {
  "use strict";

  // a button held down: a swap between its press and its release would lose the click
  var pressing = false;

  function busy(live) {
    if (pressing) return true;
    var active = document.activeElement;
    if (active && live.contains(active) && /^(INPUT|SELECT|TEXTAREA)$/.test(active.tagName)) return true;
    if (live.querySelector("details[open]")) return true;
    // a reason typed and left (the operator clicked elsewhere) is not wiped by a refresh
    var fields = live.querySelectorAll("textarea, input:not([type]), input[type=text], input[type=search]");
    for (var i = 0; i < fields.length; i++) if (fields[i].value !== fields[i].defaultValue) return true;
    return live.querySelector("input[name=ids]:checked") !== null;
  }

  // deferred: a refresh came while the operator was busy. It runs once they are not
  // (focus leaves the field, the typed text is cleared, the <details> closed, the rows
  // unticked): a job's last change comes once, and its stream then ends.
  var pending = false, again = false, deferred = false;
  function refresh() {
    var live = document.getElementById("live");
    if (!live) return;
    if (busy(live)) { deferred = true; return; }
    deferred = false;
    // a refresh while one is being fetched is not dropped: that fetch may have read the
    // page before the change it announces (a job's last change, after which no other comes)
    if (pending) { again = true; return; }
    pending = true;
    fetch(window.location.href, { headers: { "X-Pgworker-Partial": "1" }, credentials: "same-origin" })
      .then(function (response) { return response.ok ? response.text() : null; })
      .then(function (html) {
        if (!html) return;
        var doc = new DOMParser().parseFromString(html, "text/html");
        var fresh = doc.getElementById("live");
        var current = document.getElementById("live");
        if (!fresh || !current) return;
        if (busy(current)) { deferred = true; return; }
        current.replaceWith(document.importNode(fresh, true));
        // a page that no longer follows anything (its job finished): stop the stream,
        // which would otherwise reconnect and poll for a change that never comes
        if (events && !doc.body.getAttribute("data-live")) events.close();
      })
      .catch(function () { /* the page stays as it was loaded */ })
      .then(function () {
        pending = false;
        if (again) { again = false; refresh(); }
      });
  }

  function resume() {
    if (!deferred) return;
    var live = document.getElementById("live");
    if (live && !busy(live)) refresh();
  }
  // after the event's default action (focus moved, text changed, details toggled)
  function resumeSoon() { window.setTimeout(resume, 0); }
  document.addEventListener("pointerdown", function () { pressing = true; }, true);
  function released() { pressing = false; resumeSoon(); }
  document.addEventListener("pointerup", released, true);
  document.addEventListener("pointercancel", released, true);
  document.addEventListener("focusout", resumeSoon);
  document.addEventListener("input", resumeSoon);
  document.addEventListener("change", resumeSoon);
  document.addEventListener("toggle", resumeSoon, true);  // toggle does not bubble

  var events = null;
  var source = document.body.getAttribute("data-live");
  if (source && window.EventSource) {
    events = new EventSource(source, { withCredentials: true });
    events.addEventListener("refresh", refresh);
  }

  document.addEventListener("submit", function (event) {
    var form = event.target;
    var question = form.getAttribute("data-confirm");
    if (question && !window.confirm(question)) event.preventDefault();
  });

  document.addEventListener("change", function (event) {
    var box = event.target;
    if (!box.hasAttribute || !box.hasAttribute("data-select-all")) return;
    var boxes = document.querySelectorAll("input[name=ids]");
    for (var i = 0; i < boxes.length; i++) boxes[i].checked = box.checked;
  });
})();
