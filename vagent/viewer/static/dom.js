/* What both pages (index.html + viewer.js, sweep.html + sweep.js) share, loaded before them.
   el(tag, attrs, ...kids): an element; attrs "class" and "text" set className / textContent,
   "on<event>" adds a listener, true is an empty attribute, null / undefined / false are left out. */
function el(tag, attrs, ...kids) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined || v === false) continue;
    if (k === "class") e.className = v;
    else if (k === "text") e.textContent = v;
    else if (k.startsWith("on")) e.addEventListener(k.slice(2), v);
    else e.setAttribute(k, v === true ? "" : v);
  }
  for (const kid of kids.flat()) if (kid !== null && kid !== undefined) e.append(kid);
  return e;
}
