// DOM helpers: build elements safely (textContent only, never innerHTML).

const SVG_NS = "http://www.w3.org/2000/svg";

// Apply props to an element: text, className, testid, title, dataset, attrs, style, on*.
function applyProps(node, props) {
  for (const [key, value] of Object.entries(props || {})) {
    if (value === undefined || value === null) continue;
    if (key === "text") node.textContent = String(value);
    else if (key === "className") node.setAttribute("class", value);
    else if (key === "testid") node.setAttribute("data-testid", value);
    else if (key === "dataset") setData(node, value);
    else if (key === "attrs") setAttrs(node, value);
    else if (key === "style") Object.assign(node.style, value);
    else if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
    else node.setAttribute(key, String(value));
  }
}

function setData(node, data) {
  for (const [k, v] of Object.entries(data)) {
    if (v !== undefined && v !== null) node.dataset[k] = String(v);
  }
}

function setAttrs(node, attrs) {
  for (const [k, v] of Object.entries(attrs)) {
    if (v !== undefined && v !== null) node.setAttribute(k, String(v));
  }
}

function append(node, children) {
  for (const child of children.flat()) {
    if (child === undefined || child === null || child === false) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

// h("div", {className: "card"}, "text", childNode, ...)
export function h(tag, props, ...children) {
  const node = document.createElement(tag);
  applyProps(node, props);
  return append(node, children);
}

// The same for SVG elements.
export function svg(tag, props, ...children) {
  const node = document.createElementNS(SVG_NS, tag);
  applyProps(node, props);
  return append(node, children);
}

// A card: a titled box holding a page section.
export function card(title, props, ...children) {
  const box = h("section", Object.assign({ className: "card" }, props || {}));
  if (title) box.append(h("h2", { className: "card-title" }, title));
  return append(box, children);
}

// A table inside a horizontally scrolling wrapper. columns: [label]; returns {wrap, table, tbody}.
export function table(testid, columns) {
  const head = h("tr", null, columns.map((c) => h("th", null, c)));
  const tbody = h("tbody");
  const tbl = h("table", { className: "data", testid }, h("thead", null, head), tbody);
  return { wrap: h("div", { className: "table-wrap" }, tbl), table: tbl, tbody };
}

// A table row saying the table is empty.
export function emptyRow(colspan, text) {
  return h("tr", null, h("td", { colspan, className: "muted" }, text));
}

// List items, or one muted item saying there are none.
export function itemsOr(items, text) {
  return items.length ? items : [h("li", { className: "muted" }, text)];
}

// An empty-state line.
export function empty(text) {
  return h("p", { className: "muted" }, text);
}
