// Live pages: when the server says what the page shows has changed (server-sent events from
// data-live-url), fetch the page again and swap in its <main>. Never while the reader is in
// the middle of a form (a field focused, or changed and not yet sent): the swap waits until
// they are done. A hidden tab lets go of its stream and catches up when shown again. Without
// EventSource, or once the stream is refused for good (signed out), the page reloads every
// few seconds instead; without JavaScript, a <noscript> refresh does.
(function () {
  "use strict";
  var body = document.body;
  var url = body.getAttribute("data-live-url");
  if (!url) { return; }

  function dirty(field) {
    if (field.type === "hidden" || field.type === "submit" || field.type === "button") {
      return false;
    }
    if (field.type === "checkbox" || field.type === "radio") {
      return field.checked !== field.defaultChecked;
    }
    if (field.tagName === "SELECT") {
      // A single select with no `selected` option starts on its first option.
      var options = field.options;
      var marked = false;
      for (var i = 0; i < options.length; i++) { marked = marked || options[i].defaultSelected; }
      for (var j = 0; j < options.length; j++) {
        var initially = options[j].defaultSelected || (!marked && !field.multiple && j === 0);
        if (options[j].selected !== initially) { return true; }
      }
      return false;
    }
    return "defaultValue" in field && field.value !== field.defaultValue;
  }

  function busy() {
    var el = document.activeElement;
    if (el && /^(INPUT|SELECT|TEXTAREA)$/.test(el.tagName)) { return true; }
    var fields = document.querySelectorAll("#main input, #main select, #main textarea");
    for (var i = 0; i < fields.length; i++) {
      if (dirty(fields[i])) { return true; }
    }
    return false;
  }

  function reloadEvery(seconds) {
    setInterval(function () {
      if (!busy() && document.visibilityState === "visible") { window.location.reload(); }
    }, seconds * 1000);
  }

  if (!window.EventSource || !window.fetch || !window.DOMParser) { reloadEvery(5); return; }

  var inflight = false;
  var pending = false;
  var source = null;
  var ended = false;

  function refresh() {
    if (inflight || busy() || document.visibilityState !== "visible") {
      pending = true;
      return;
    }
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
        if (!doc.body.getAttribute("data-live-url")) { stop(); ended = true; }  // not live now
      })
      .catch(function () { /* the next change event tries again */ })
      .then(function () {
        inflight = false;
        if (pending) { refresh(); }
      });
  }

  function stop() {
    if (source) { source.close(); source = null; }
  }

  function start() {
    if (source || ended) { return; }
    var version = body.getAttribute("data-version") || "";
    source = new EventSource(url + "?since=" + encodeURIComponent(version));
    source.addEventListener("changed", refresh);
    source.onerror = function () {
      // EventSource retries on its own; CLOSED means refused for good (e.g. signed out).
      if (source && source.readyState === EventSource.CLOSED) {
        stop();
        ended = true;
        reloadEvery(5);
      }
    };
  }

  document.addEventListener("visibilitychange", function () {
    if (document.visibilityState === "visible") {
      start();  // from the version shown: a change while hidden is reported at once
      if (pending) { refresh(); }
    } else {
      stop();
    }
  });
  // A change that arrived while the reader was busy is applied once they are done.
  setInterval(function () { if (pending && !inflight && !busy()) { refresh(); } }, 1000);
  if (document.visibilityState === "visible") { start(); }
})();
