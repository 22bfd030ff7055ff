//! The bounded schema profile runnables declare their input and output in, read from YAML
//! with every problem reported, rendered as standard JSON Schema (for `show` and for agent
//! tools), and checked against JSON values with every violation reported by JSON path.
//!
//! The profile: `type` (one of object, array, string, integer, number, boolean), `nullable`,
//! `description`, `enum`; objects take `properties`, `required`, `additionalProperties`
//! (default false: a member the schema does not declare is refused); arrays take `items`
//! (required), `minItems`, `maxItems`; strings take `minLength`, `maxLength`; integers and
//! numbers take `minimum`, `maximum`. Nothing else. `integer` accepts only JSON numbers
//! written without a fraction or exponent (`1`, not `1.0` or `1e0`); nothing is coerced.
//!
//! This module must never run anything or read files: it is pure data and checks.

use serde_json::{Map, Value, json};

use crate::error::{Violation, codes};
use strict_yaml::read::{self, Problem, Report, join};
use strict_yaml::{Node, NodeKind, Resolved};
use wire_enum::wire_enum;

/// The most violations one check reports (the rest are counted).
pub const MAX_VIOLATIONS: usize = 100;

wire_enum! {
    /// A schema's type.
    pub enum SchemaType {
        Object = "object",
        Array = "array",
        String = "string",
        Integer = "integer",
        Number = "number",
        Boolean = "boolean",
    }
    kind = "schema_type";
}

impl SchemaType {
    /// The keywords this type takes beyond the common ones.
    fn own_keywords(self) -> &'static [&'static str] {
        match self {
            SchemaType::Object => &["properties", "required", "additionalProperties"],
            SchemaType::Array => &["items", "minItems", "maxItems"],
            SchemaType::String => &["minLength", "maxLength"],
            SchemaType::Integer | SchemaType::Number => &["minimum", "maximum"],
            SchemaType::Boolean => &[],
        }
    }
}

const COMMON_KEYWORDS: &[&str] = &["type", "nullable", "description", "enum"];
const TYPED_KEYWORDS: &[(&str, &str)] = &[
    ("properties", "object"),
    ("required", "object"),
    ("additionalProperties", "object"),
    ("items", "array"),
    ("minItems", "array"),
    ("maxItems", "array"),
    ("minLength", "string"),
    ("maxLength", "string"),
    ("minimum", "integer and number"),
    ("maximum", "integer and number"),
];

/// One schema node of the profile.
#[derive(Debug, Clone, PartialEq)]
pub struct Schema {
    pub ty: SchemaType,
    pub nullable: bool,
    pub description: Option<String>,
    pub enumeration: Option<Vec<Value>>,
    /// Declared members in declaration order (objects).
    pub properties: Vec<(String, Schema)>,
    pub required: Vec<String>,
    pub additional_properties: bool,
    pub items: Option<Box<Schema>>,
    pub min_items: Option<u64>,
    pub max_items: Option<u64>,
    pub min_length: Option<u64>,
    pub max_length: Option<u64>,
    pub minimum: Option<f64>,
    pub maximum: Option<f64>,
}

impl Schema {
    fn of(ty: SchemaType) -> Schema {
        Schema {
            ty,
            nullable: false,
            description: None,
            enumeration: None,
            properties: Vec::new(),
            required: Vec::new(),
            additional_properties: false,
            items: None,
            min_items: None,
            max_items: None,
            min_length: None,
            max_length: None,
            minimum: None,
            maximum: None,
        }
    }

    /// Reads a schema of the profile from `node`, found at key path `path`, with every
    /// problem of it reported. This is the one way to read the profile from YAML: a
    /// declaration's `input` and `output` are read with it, and so are other formats' schemas
    /// (a workflow's answer schemas). A problem is a wrong type (in the words of the profile)
    /// or a rule of the profile filed under a `declaration.*` code of [`codes`].
    pub fn read(node: &Node, path: &str) -> Result<Schema, Vec<Problem>> {
        let mut problems = Vec::new();
        match Schema::parse(node, path, &mut problems) {
            Some(schema) if problems.is_empty() => Ok(schema),
            _ => Err(problems),
        }
    }

    /// Reads a schema node, reporting every problem; `None` when the node is unusable.
    fn parse(node: &Node, path: &str, problems: &mut Vec<Problem>) -> Option<Schema> {
        let map = problems.keep(read::mapping(
            node,
            path,
            "a schema must be a mapping, not {found}",
        ))?;
        let ty = match map.get("type") {
            None => {
                problems.report(Problem::format(
                    node,
                    path,
                    codes::SCHEMA_STRUCTURE,
                    "every schema needs a `type` (object, array, string, integer, number or boolean)",
                ));
                None
            }
            Some(t) => match t.as_str().and_then(|s| SchemaType::from_wire(s).ok()) {
                Some(ty) => Some(ty),
                None => {
                    problems.report(Problem::format(
                        t,
                        join(path, "type"),
                        codes::INVALID_VALUE,
                        format!(
                            "{} is not a type of the profile; use one of object, array, string, integer, number, boolean",
                            t.describe()
                        ),
                    ));
                    None
                }
            },
        };
        // Keywords first, so every out-of-profile one is named even when the type is wrong.
        let mut allowed: Vec<&str> = COMMON_KEYWORDS.to_vec();
        allowed.extend(ty.map(SchemaType::own_keywords).unwrap_or_default());
        for (key, name) in map.unknown_keys(&allowed) {
            let message = match TYPED_KEYWORDS.iter().find(|(k, _)| *k == name) {
                Some((_, applies)) => format!(
                    "`{name}` applies to {applies} schemas only{}",
                    ty.map(|t| format!(", and this one is `{}`", t.as_str()))
                        .unwrap_or_default()
                ),
                None => format!(
                    "`{name}` is outside the bounded schema profile (allowed here: {})",
                    allowed_here(ty)
                ),
            };
            problems.report(Problem::format(key, path, codes::SCHEMA_KEYWORD, message));
        }
        let ty = ty?;
        let mut schema = Schema::of(ty);
        if let Some(n) = map.get("nullable") {
            let path = join(path, "nullable");
            schema.nullable = problems
                .keep(read::boolean(
                    n,
                    &path,
                    "must be true or false, not {found}",
                ))
                .unwrap_or_default();
        }
        if let Some(d) = map.get("description") {
            let path = join(path, "description");
            schema.description = problems
                .keep(read::string(d, &path, "must be a string, not {found}"))
                .map(str::to_owned);
        }
        match ty {
            SchemaType::Object => parse_object(node, path, problems, &mut schema),
            SchemaType::Array => {
                match map.get("items") {
                    None => problems.report(Problem::format(
                        node,
                        path,
                        codes::SCHEMA_STRUCTURE,
                        "an array schema needs `items`, the schema of its elements",
                    )),
                    Some(items) => {
                        schema.items =
                            Schema::parse(items, &join(path, "items"), problems).map(Box::new)
                    }
                }
                schema.min_items = count(node, "minItems", path, problems);
                schema.max_items = count(node, "maxItems", path, problems);
                check_range(
                    node,
                    path,
                    problems,
                    schema.min_items,
                    schema.max_items,
                    "minItems",
                );
            }
            SchemaType::String => {
                schema.min_length = count(node, "minLength", path, problems);
                schema.max_length = count(node, "maxLength", path, problems);
                check_range(
                    node,
                    path,
                    problems,
                    schema.min_length,
                    schema.max_length,
                    "minLength",
                );
            }
            SchemaType::Integer | SchemaType::Number => {
                schema.minimum = bound(node, "minimum", path, problems);
                schema.maximum = bound(node, "maximum", path, problems);
                if let (Some(lo), Some(hi)) = (schema.minimum, schema.maximum)
                    && lo > hi
                {
                    problems.report(Problem::format(
                        node,
                        join(path, "minimum"),
                        codes::INVALID_VALUE,
                        format!("minimum {lo} is above maximum {hi}"),
                    ));
                }
            }
            SchemaType::Boolean => {}
        }
        if let Some(e) = map.get("enum") {
            schema.enumeration = parse_enum(e, &join(path, "enum"), problems, &schema);
        }
        Some(schema)
    }

    /// The schema as standard JSON Schema: `nullable` becomes a type list with `"null"`, and
    /// objects always state `additionalProperties`.
    pub fn to_json(&self) -> Value {
        let mut m = Map::new();
        if self.nullable {
            m.insert("type".into(), json!([self.ty.as_str(), "null"]));
        } else {
            m.insert("type".into(), json!(self.ty.as_str()));
        }
        if let Some(d) = &self.description {
            m.insert("description".into(), json!(d));
        }
        if let Some(e) = &self.enumeration {
            let mut values = e.clone();
            if self.nullable {
                values.push(Value::Null);
            }
            m.insert("enum".into(), Value::Array(values));
        }
        match self.ty {
            SchemaType::Object => {
                let props: Map<String, Value> = self
                    .properties
                    .iter()
                    .map(|(k, s)| (k.clone(), s.to_json()))
                    .collect();
                m.insert("properties".into(), Value::Object(props));
                m.insert("required".into(), json!(self.required));
                m.insert(
                    "additionalProperties".into(),
                    json!(self.additional_properties),
                );
            }
            SchemaType::Array => {
                if let Some(items) = &self.items {
                    m.insert("items".into(), items.to_json());
                }
                insert_opt(&mut m, "minItems", self.min_items.map(Value::from));
                insert_opt(&mut m, "maxItems", self.max_items.map(Value::from));
            }
            SchemaType::String => {
                insert_opt(&mut m, "minLength", self.min_length.map(Value::from));
                insert_opt(&mut m, "maxLength", self.max_length.map(Value::from));
            }
            SchemaType::Integer | SchemaType::Number => {
                insert_opt(&mut m, "minimum", self.minimum.map(number));
                insert_opt(&mut m, "maximum", self.maximum.map(number));
            }
            SchemaType::Boolean => {}
        }
        Value::Object(m)
    }

    /// Every way `value` breaks this schema (at most [`MAX_VIOLATIONS`], then one line
    /// counting the rest). Empty when it conforms.
    pub fn validate(&self, value: &Value) -> Vec<Violation> {
        let mut check = Check {
            path: Vec::new(),
            out: Vec::new(),
            dropped: 0,
        };
        check.node(self, value);
        if check.dropped > 0 {
            check.out.push(Violation {
                path: "$".into(),
                rule: "more",
                message: format!("{} more violation(s) not listed", check.dropped),
            });
        }
        check.out
    }
}

fn insert_opt(m: &mut Map<String, Value>, key: &str, v: Option<Value>) {
    if let Some(v) = v {
        m.insert(key.into(), v);
    }
}

/// A bound as JSON: whole numbers print without a fraction.
fn number(f: f64) -> Value {
    if f.fract() == 0.0 && f.abs() < 9.0e15 {
        json!(f as i64)
    } else {
        json!(f)
    }
}

fn allowed_here(ty: Option<SchemaType>) -> String {
    let mut all: Vec<&str> = COMMON_KEYWORDS.to_vec();
    match ty {
        Some(t) => all.extend(t.own_keywords()),
        None => all.extend(TYPED_KEYWORDS.iter().map(|(k, _)| *k)),
    }
    all.join(", ")
}

fn parse_object(node: &Node, path: &str, problems: &mut Vec<Problem>, schema: &mut Schema) {
    if let Some(props) = node.get("properties") {
        let ppath = join(path, "properties");
        let properties = problems.keep(read::mapping(
            props,
            &ppath,
            "must be a mapping of property names to schemas, not {found} (write `{}` for none)",
        ));
        for (key, value) in properties.iter().flat_map(|p| p.entries()) {
            let Some(name) = problems.keep(read::string(
                key,
                &ppath,
                "a property name must be a string, not {found}",
            )) else {
                continue;
            };
            if let Some(s) = Schema::parse(value, &join(&ppath, name), problems) {
                schema.properties.push((name.to_owned(), s));
            }
        }
    }
    if let Some(req) = node.get("required") {
        let rpath = join(path, "required");
        let required = problems.keep(read::sequence(
            req,
            &rpath,
            "must be a list of property names, not {found} (write `[]` for none)",
        ));
        for item in required.unwrap_or_default() {
            let Some(name) = problems.keep(read::string(
                item,
                &rpath,
                "must list property names, not {found}",
            )) else {
                continue;
            };
            let refuse =
                |message: String| Problem::format(item, &rpath, codes::SCHEMA_STRUCTURE, message);
            if schema.required.iter().any(|r| r == name) {
                problems.report(refuse(format!("`{name}` is listed twice")));
                continue;
            }
            let declared = node.get("properties").and_then(|p| p.get(name)).is_some();
            if !declared {
                problems.report(refuse(format!(
                    "`{name}` is required but not declared in `properties`"
                )));
                continue;
            }
            schema.required.push(name.to_owned());
        }
    }
    if let Some(a) = node.get("additionalProperties") {
        let path = join(path, "additionalProperties");
        schema.additional_properties = problems
            .keep(read::boolean(
                a,
                &path,
                "must be true or false (a schema is outside the profile), not {found}",
            ))
            .unwrap_or_default();
    }
}

fn count(node: &Node, key: &str, path: &str, problems: &mut Vec<Problem>) -> Option<u64> {
    let v = node.get(key)?;
    problems
        .keep(read::integer(
            v,
            &join(path, key),
            0..=i64::MAX,
            "must be a whole number of at least 0, not {found}",
        ))
        .and_then(|i| u64::try_from(i).ok())
}

fn bound(node: &Node, key: &str, path: &str, problems: &mut Vec<Problem>) -> Option<f64> {
    let v = node.get(key)?;
    problems.keep(read::number(
        v,
        &join(path, key),
        "must be a finite number, not {found}",
    ))
}

fn check_range(
    node: &Node,
    path: &str,
    problems: &mut Vec<Problem>,
    lo: Option<u64>,
    hi: Option<u64>,
    key: &str,
) {
    if let (Some(lo), Some(hi)) = (lo, hi)
        && lo > hi
    {
        problems.report(Problem::format(
            node,
            join(path, key),
            codes::INVALID_VALUE,
            format!("the lower bound {lo} is above the upper bound {hi}"),
        ));
    }
}

fn parse_enum(
    e: &Node,
    path: &str,
    problems: &mut Vec<Problem>,
    schema: &Schema,
) -> Option<Vec<Value>> {
    let items = problems.keep(read::sequence(
        e,
        path,
        "must be a list of allowed values, not {found}",
    ))?;
    if items.is_empty() {
        problems.report(Problem::format(
            e,
            path,
            codes::INVALID_VALUE,
            "lists no value, so nothing could pass",
        ));
        return None;
    }
    let mut values = Vec::new();
    for item in items {
        let v = match (&item.kind, schema.ty) {
            (NodeKind::Scalar(s), SchemaType::String) if s.resolved == Resolved::Str => {
                json!(s.text)
            }
            (NodeKind::Scalar(s), SchemaType::Integer) => match s.resolved {
                Resolved::Int(i) => json!(i),
                _ => Value::Null,
            },
            (NodeKind::Scalar(s), SchemaType::Number) => match s.resolved {
                Resolved::Int(i) => json!(i),
                Resolved::Float(f) if f.is_finite() => json!(f),
                _ => Value::Null,
            },
            (NodeKind::Scalar(s), SchemaType::Boolean) => match s.resolved {
                Resolved::Bool(b) => json!(b),
                _ => Value::Null,
            },
            _ => Value::Null,
        };
        let refuse = |message: String| Problem::format(item, path, codes::INVALID_VALUE, message);
        if v.is_null() {
            problems.report(refuse(format!(
                "{} is not a {} (enum applies to string, integer, number and boolean schemas, each value of that type)",
                item.describe(),
                schema.ty.as_str()
            )));
            continue;
        }
        if values.contains(&v) {
            problems.report(refuse(format!("{v} is listed twice")));
            continue;
        }
        values.push(v);
    }
    Some(values)
}

enum Seg<'a> {
    Key(&'a str),
    Index(usize),
}

struct Check<'a> {
    path: Vec<Seg<'a>>,
    out: Vec<Violation>,
    dropped: usize,
}

fn is_identifier(s: &str) -> bool {
    let mut chars = s.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
}

fn kind_of(v: &Value) -> String {
    match v {
        Value::Null => "null".into(),
        Value::Bool(b) => format!("the boolean {b}"),
        Value::Number(n) => format!("the number {n}"),
        Value::String(s) if s.len() > 40 => "a string".into(),
        Value::String(s) => format!("the string {s:?}"),
        Value::Array(_) => "an array".into(),
        Value::Object(_) => "an object".into(),
    }
}

impl<'a> Check<'a> {
    fn path_text(&self) -> String {
        if self.path.is_empty() {
            return "$".into();
        }
        let mut s = String::new();
        for seg in &self.path {
            match seg {
                Seg::Key(k) if is_identifier(k) => {
                    if !s.is_empty() {
                        s.push('.');
                    }
                    s.push_str(k);
                }
                Seg::Key(k) => s.push_str(&format!("[{}]", json!(k))),
                Seg::Index(i) => s.push_str(&format!("[{i}]")),
            }
        }
        s
    }

    fn report(&mut self, rule: &'static str, message: String) {
        if self.out.len() >= MAX_VIOLATIONS {
            self.dropped += 1;
            return;
        }
        let path = self.path_text();
        self.out.push(Violation {
            path,
            rule,
            message,
        });
    }

    fn node(&mut self, schema: &Schema, value: &'a Value) {
        if value.is_null() {
            if !schema.nullable {
                self.report(
                    "null",
                    format!("null is not allowed here (expected {})", schema.ty.as_str()),
                );
            }
            return;
        }
        match (schema.ty, value) {
            (SchemaType::Object, Value::Object(members)) => self.object(schema, members),
            (SchemaType::Array, Value::Array(items)) => {
                let n = items.len() as u64;
                if let Some(min) = schema.min_items
                    && n < min
                {
                    self.report(
                        "min_items",
                        format!("has {n} item(s); at least {min} required"),
                    );
                }
                if let Some(max) = schema.max_items
                    && n > max
                {
                    self.report(
                        "max_items",
                        format!("has {n} item(s); at most {max} allowed"),
                    );
                }
                if let Some(item_schema) = &schema.items {
                    for (i, item) in items.iter().enumerate() {
                        self.path.push(Seg::Index(i));
                        self.node(item_schema, item);
                        self.path.pop();
                    }
                }
            }
            (SchemaType::String, Value::String(s)) => {
                let n = s.chars().count() as u64;
                if let Some(min) = schema.min_length
                    && n < min
                {
                    self.report(
                        "min_length",
                        format!("is {n} character(s) long; at least {min} required"),
                    );
                }
                if let Some(max) = schema.max_length
                    && n > max
                {
                    self.report(
                        "max_length",
                        format!("is {n} character(s) long; at most {max} allowed"),
                    );
                }
                self.enumeration(schema, value);
            }
            (SchemaType::Integer, Value::Number(n)) if n.is_i64() || n.is_u64() => {
                self.bounds(schema, n.as_f64().unwrap_or(0.0));
                self.enumeration(schema, value);
            }
            (SchemaType::Number, Value::Number(n)) => {
                self.bounds(schema, n.as_f64().unwrap_or(0.0));
                self.enumeration(schema, value);
            }
            (SchemaType::Boolean, Value::Bool(_)) => self.enumeration(schema, value),
            (ty, other) => {
                let expected = match ty {
                    SchemaType::Integer => "an integer (a whole number without fraction)",
                    SchemaType::Number => "a number",
                    SchemaType::String => "a string",
                    SchemaType::Boolean => "a boolean",
                    SchemaType::Object => "an object",
                    SchemaType::Array => "an array",
                };
                self.report(
                    "type",
                    format!("expected {expected}, got {}", kind_of(other)),
                );
            }
        }
    }

    fn object(&mut self, schema: &Schema, members: &'a Map<String, Value>) {
        for name in &schema.required {
            if !members.contains_key(name) {
                self.report(
                    "required",
                    format!("the required member `{name}` is missing"),
                );
            }
        }
        for (name, value) in members {
            match schema.properties.iter().find(|(k, _)| k == name) {
                Some((_, s)) => {
                    self.path.push(Seg::Key(name));
                    self.node(s, value);
                    self.path.pop();
                }
                None if schema.additional_properties => {}
                None => {
                    self.path.push(Seg::Key(name));
                    self.report(
                        "additional",
                        "this member is not declared by the schema (additionalProperties is false)"
                            .into(),
                    );
                    self.path.pop();
                }
            }
        }
    }

    fn bounds(&mut self, schema: &Schema, x: f64) {
        if let Some(min) = schema.minimum
            && x < min
        {
            self.report("minimum", format!("{x} is below the minimum {min}"));
        }
        if let Some(max) = schema.maximum
            && x > max
        {
            self.report("maximum", format!("{x} is above the maximum {max}"));
        }
    }

    fn enumeration(&mut self, schema: &Schema, value: &Value) {
        if let Some(values) = &schema.enumeration {
            let hit = values.iter().any(|v| match (v, value) {
                (Value::Number(a), Value::Number(b)) => a.as_f64() == b.as_f64(),
                _ => v == value,
            });
            if !hit {
                let list: Vec<String> = values.iter().map(|v| v.to_string()).collect();
                self.report(
                    "enum",
                    format!("{} is not one of {}", kind_of(value), list.join(", ")),
                );
            }
        }
    }
}
