// Live pages: when the server says what the page shows has changed (server-sent events from
// data-live-url), fetch the page again and swap in its <main>. Never while the reader is
// typing or choosing in a form: the swap waits until they are done. Without EventSource the
// page reloads every few seconds instead (and without JavaScript, a <noscript> refresh does).
(function () {
  "use strict";
  var body = document.body;
  var url = body.getAttribute("data-live-url");
  if (!url) { return; }
  var touched = false;
  document.addEventListener("input", function () { touched = true; });

  function busy() {
    var el = document.activeElement;
    return touched || (el && /^(INPUT|SELECT|TEXTAREA)$/.test(el.tagName));
  }

  if (!window.EventSource || !window.fetch || !window.DOMParser) {
    setInterval(function () {
      if (!busy() && document.visibilityState === "visible") { window.location.reload(); }
    }, 5000);
    return;
  }

  var inflight = false;
  var pending = false;

  function refresh() {
    if (inflight || busy()) { pending = true; return; }
    inflight = true;
    pending = false;
    fetch(window.location.href, { credentials: "same-origin" })
      .then(function (response) {
        if (!response.ok || response.redirected) { throw new Error("status " + response.status); }
        return response.text();
      })
      .then(function (html) {
        var doc = new DOMParser().parseFromString(html, "text/html");
        var fresh = doc.getElementById("main");
        var main = document.getElementById("main");
        if (fresh && main) { main.innerHTML = fresh.innerHTML; }
        body.setAttribute("data-version", doc.body.getAttribute("data-version") || "");
        if (!doc.body.getAttribute("data-live-url")) { source.close(); }  // no longer live
      })
      .catch(function () { /* the next change event tries again */ })
      .then(function () {
        inflight = false;
        if (pending) { refresh(); }
      });
  }

  var version = body.getAttribute("data-version") || "";
  var source = new EventSource(url + "?since=" + encodeURIComponent(version));
  source.addEventListener("changed", refresh);
  // A change that arrived while the reader was busy is applied once they are done.
  setInterval(function () { if (pending && !inflight && !busy()) { refresh(); } }, 1000);
})();
