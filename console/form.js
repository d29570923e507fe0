// A form generated from a tool's JSON Schema: objects as fieldsets, arrays as lists of items
// that can be added and removed, enums as selects, defaults filled in, required fields marked.
// The server validates (it is the one authority on its schemas); its 400 details name fields
// by JSON pointer, and `showErrors` puts each message under the field it names.

import { h, uid } from "./dom.js";

/**
 * schemaForm(schema, {submitLabel, onSubmit(params), overrides}) →
 *   {form, showErrors(details), clearErrors(), read()}
 * `overrides` maps a JSON pointer ("/script") to a function(spec) → {control, read()} that
 * replaces the generated control of that field.
 */
export function schemaForm(schema, { submitLabel = "Run", onSubmit, overrides = {} } = {}) {
  const root = schema || {};
  const ctx = { root, overrides };
  const top = editor(ctx, resolve(root, root), { path: "", name: null, required: true });
  const formError = h("div", { class: "form-error", role: "alert" });
  const button = h("button", { type: "submit", class: "primary" }, submitLabel);
  const form = h("form", { class: "schema-form", novalidate: true }, top.el, formError, h("div", { class: "row" }, button));

  form.addEventListener("submit", (event) => {
    event.preventDefault();
    clearErrors();
    let params;
    try {
      params = top.read().value ?? {};
    } catch (err) {
      // A field that could not be read (JSON that does not parse) stops the call here.
      if (err instanceof FieldError) return showErrors([{ path: err.path, message: err.message }]);
      throw err;
    }
    if (onSubmit) onSubmit(params);
  });
  // Ctrl+Enter submits from a textarea, where Enter is a new line.
  form.addEventListener("keydown", (event) => {
    if (event.key === "Enter" && (event.ctrlKey || event.metaKey) && event.target.tagName === "TEXTAREA") {
      event.preventDefault();
      form.requestSubmit();
    }
  });

  function clearErrors() {
    for (const el of form.querySelectorAll(".field-error")) el.remove();
    for (const el of form.querySelectorAll("[aria-invalid]")) {
      el.removeAttribute("aria-invalid");
      el.removeAttribute("aria-describedby");
    }
    formError.replaceChildren();
  }

  /** Each detail under the field its pointer names, or the nearest enclosing one. */
  function showErrors(details) {
    let first = null;
    for (const detail of details) {
      // A problem with the whole input (pointer "") goes above the button, not on a field.
      const holder = detail.path ? nearestField(form, detail.path) : null;
      const id = uid("err");
      const message = h("p", { class: "field-error", id, dataset: { path: detail.path || "" } }, holder && holder.dataset.path !== detail.path ? `${detail.path}: ${detail.message}` : detail.message);
      if (holder) {
        const control = holder.querySelector(":scope > .control, :scope > .field-body > .control") || holder.querySelector("input, select, textarea");
        holder.append(message);
        if (control) {
          control.setAttribute("aria-invalid", "true");
          control.setAttribute("aria-describedby", id);
        }
        first = first || control;
      } else {
        formError.append(message);
      }
    }
    if (first) first.focus();
  }

  return { form, showErrors, clearErrors, read: () => top.read().value ?? {}, button };
}

class FieldError extends Error {
  constructor(path, message) {
    super(message);
    this.path = path;
  }
}

/** The field element for `path`, else for the closest parent path that has one. */
function nearestField(form, path) {
  let at = path;
  for (;;) {
    const found = [...form.querySelectorAll("[data-path]")].find((el) => el.dataset.path === at && el.classList.contains("field"));
    if (found) return found;
    at = at.slice(0, at.lastIndexOf("/"));
    if (at === "") return null;
  }
}

/** Follows "$ref": "#/$defs/X" (or #/definitions/X) within the tool's own schema. */
function resolve(root, schema, depth = 0) {
  if (!schema || typeof schema !== "object" || depth > 20) return schema || {};
  if (typeof schema.$ref === "string" && schema.$ref.startsWith("#/")) {
    let target = root;
    for (const part of schema.$ref.slice(2).split("/")) {
      target = target && target[part.replace(/~1/g, "/").replace(/~0/g, "~")];
    }
    const { $ref, ...rest } = schema;
    return resolve(root, { ...(target || {}), ...rest }, depth + 1);
  }
  return schema;
}

/** The type a field edits: the first of a type list that is not "null". */
function typeOf(schema) {
  if (Array.isArray(schema.enum)) return "enum";
  const type = Array.isArray(schema.type) ? schema.type.find((t) => t !== "null") : schema.type;
  if (type) return type;
  if (schema.properties) return "object";
  if (schema.items) return "array";
  return "json";
}

function pointer(path, name) {
  return `${path}/${String(name).replace(/~/g, "~0").replace(/\//g, "~1")}`;
}

/** editor(ctx, schema, {path, name, required}) → {el, read() → {value} or {} when unset} */
function editor(ctx, schema, spec) {
  const override = ctx.overrides[spec.path];
  if (override) return wrap(spec, schema, override({ ...spec, schema }));
  switch (typeOf(schema)) {
    case "object":
      return objectEditor(ctx, schema, spec);
    case "array":
      return arrayEditor(ctx, schema, spec);
    case "enum":
      return wrap(spec, schema, enumControl(schema, spec));
    case "boolean":
      return wrap(spec, schema, booleanControl(schema, spec));
    case "integer":
    case "number":
      return wrap(spec, schema, numberControl(schema, typeOf(schema)));
    case "string":
      return wrap(spec, schema, stringControl(schema, spec));
    default:
      return wrap(spec, schema, jsonControl(schema, spec));
  }
}

/** A labelled field around one control. */
function wrap(spec, schema, { control, read, inline }) {
  control.classList.add("control");
  control.id = control.id || uid("field");
  if (spec.name !== null) control.name = spec.name;
  if (spec.required) control.setAttribute("aria-required", "true");
  const label = h("label", { for: control.id }, labelText(spec, schema));
  const help = schema.description ? h("small", { class: "help" }, schema.description) : null;
  const el = inline
    ? h("div", { class: "field inline", dataset: { path: spec.path } }, control, label, help)
    : h("div", { class: "field", dataset: { path: spec.path } }, label, control, help);
  return { el, read: () => read() };
}

function labelText(spec, schema) {
  const name = spec.name === null ? "Value" : schema.title && schema.title !== spec.name ? `${spec.name} (${schema.title})` : spec.name;
  return [name, spec.required ? h("span", { class: "required", title: "required" }, " *") : null];
}

function stringControl(schema, spec) {
  const long = (schema.maxLength || 0) > 256 || schema.format === "textarea";
  const type = schema.format === "date" ? "date" : schema.format === "email" ? "email" : schema.format === "uri" ? "url" : "text";
  const control = long ? h("textarea", { rows: 4 }) : h("input", { type, autocomplete: "off" });
  if (typeof schema.default === "string") control.value = schema.default;
  if (schema.examples && schema.examples.length) control.placeholder = String(schema.examples[0]);
  return { control, read: () => (control.value === "" ? {} : { value: control.value }) };
}

function numberControl(schema, type) {
  const control = h("input", { type: "number", step: type === "integer" ? "1" : "any", inputmode: type === "integer" ? "numeric" : "decimal" });
  if (schema.minimum !== undefined) control.min = schema.minimum;
  if (schema.maximum !== undefined) control.max = schema.maximum;
  if (typeof schema.default === "number") control.value = String(schema.default);
  return { control, read: () => (control.value === "" ? {} : { value: Number(control.value) }) };
}

/** A checkbox when the field always has a value; else a select that can leave it out. */
function booleanControl(schema, spec) {
  if (spec.required || typeof schema.default === "boolean") {
    const control = h("input", { type: "checkbox", checked: schema.default === true });
    return { control, read: () => ({ value: control.checked }), inline: true };
  }
  const control = h("select", {}, h("option", { value: "" }, "(not set)"), h("option", { value: "true" }, "true"), h("option", { value: "false" }, "false"));
  return { control, read: () => (control.value === "" ? {} : { value: control.value === "true" }) };
}

function enumControl(schema, spec) {
  const choices = schema.enum;
  const hasDefault = schema.default !== undefined;
  const control = h(
    "select",
    {},
    // Without a default an optional field must be able to stay unset; a required one starts
    // unset too, so the server (not the form) says it is missing.
    hasDefault ? null : h("option", { value: "" }, spec.required ? "(choose)" : "(not set)"),
    choices.map((choice, i) => h("option", { value: String(i), selected: hasDefault && JSON.stringify(choice) === JSON.stringify(schema.default) }, typeof choice === "string" ? choice : JSON.stringify(choice))),
  );
  return { control, read: () => (control.value === "" ? {} : { value: choices[Number(control.value)] }) };
}

/** Anything the form has no widget for (oneOf, free objects, …): JSON, parsed on submit. */
function jsonControl(schema, spec) {
  const control = h("textarea", { rows: 3, class: "mono", spellcheck: "false", placeholder: "JSON" });
  if (schema.default !== undefined) control.value = JSON.stringify(schema.default, null, 2);
  return {
    control,
    read: () => {
      const text = control.value.trim();
      if (text === "") return {};
      try {
        return { value: JSON.parse(text) };
      } catch (err) {
        throw new FieldError(spec.path, `not valid JSON: ${err.message}`);
      }
    },
  };
}

function objectEditor(ctx, schema, spec) {
  const properties = schema.properties || {};
  const names = Object.keys(properties);
  const required = new Set(schema.required || []);
  if (!names.length && schema.additionalProperties !== false && spec.path !== "") {
    return wrap(spec, schema, jsonControl(schema, spec));
  }
  const children = names.map((name) => ({
    name,
    ed: editor(ctx, resolve(ctx.root, properties[name]), { path: pointer(spec.path, name), name, required: required.has(name) }),
  }));
  // The top level is the form itself; a nested object is a fieldset with its name as legend.
  const body = h("div", { class: "field-body" }, children.map((c) => c.ed.el));
  const el =
    spec.path === ""
      ? h("div", { class: "field object root", dataset: { path: "" } }, names.length ? body : h("p", { class: "muted" }, "This tool takes no parameters."))
      : h("fieldset", { class: "field object", dataset: { path: spec.path } }, h("legend", {}, labelText(spec, schema)), schema.description ? h("small", { class: "help" }, schema.description) : null, body);
  return {
    el,
    read() {
      const value = {};
      for (const c of children) {
        const got = c.ed.read();
        if ("value" in got) value[c.name] = got.value;
      }
      // An optional nested object with nothing in it is left out, not sent as {}.
      if (spec.path !== "" && !spec.required && !Object.keys(value).length) return {};
      return { value };
    },
  };
}

function arrayEditor(ctx, schema, spec) {
  const itemSchema = resolve(ctx.root, Array.isArray(schema.items) ? schema.items[0] || {} : schema.items || {});
  const list = h("ol", { class: "items" });
  const items = [];
  const label = spec.name || "item";
  const add = h("button", { type: "button", class: "small" }, `Add ${label} item`);

  function addItem(initial) {
    const index = items.length;
    const ed = editor(ctx, initial === undefined ? itemSchema : { ...itemSchema, default: initial }, { path: pointer(spec.path, index), name: `${label}[${index}]`, required: true });
    const entry = { ed };
    const remove = h("button", { type: "button", class: "small link", "aria-label": `Remove ${label} item ${index + 1}` }, "Remove");
    entry.li = h("li", {}, ed.el, remove);
    remove.addEventListener("click", () => {
      items.splice(items.indexOf(entry), 1);
      entry.li.remove();
      // The server names items by position: keep each item's pointer in step with its place.
      items.forEach((it, i) => (it.ed.el.dataset.path = pointer(spec.path, i)));
      add.focus();
    });
    items.push(entry);
    list.append(entry.li);
    return entry;
  }

  add.addEventListener("click", () => {
    const entry = addItem();
    const control = entry.li.querySelector("input, select, textarea");
    if (control) control.focus();
  });
  if (Array.isArray(schema.default)) schema.default.forEach((v) => addItem(v));

  const el = h("fieldset", { class: "field array", dataset: { path: spec.path } }, h("legend", {}, labelText(spec, schema)), schema.description ? h("small", { class: "help" }, schema.description) : null, list, add);
  return {
    el,
    read() {
      const value = items.map((entry) => entry.ed.read()).filter((got) => "value" in got).map((got) => got.value);
      if (!value.length && !spec.required && !Array.isArray(schema.default)) return {};
      return { value };
    },
  };
}

