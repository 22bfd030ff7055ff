//! `hostd flow graph`: each stage's graph as text (start layers, then edges) or as Graphviz
//! DOT. This module owns that rendering only.

use ::flow::{DependencyGraph, EdgeOrigin, Stage, StageGraph};
use anyhow::Result;

fn edge_label(kind: &str, endpoints: &[String], origin: &EdgeOrigin) -> String {
    let mut label = kind.to_owned();
    if !endpoints.is_empty() {
        label.push_str(": ");
        label.push_str(&endpoints.join(", "));
    }
    if let EdgeOrigin::Reference { key } = origin {
        label.push_str(&format!(" (via ${{endpoint}} in {key})"));
    }
    label
}

pub fn graph_text(graph: &DependencyGraph, stages: &[Stage]) -> Result<String> {
    let mut out = String::new();
    for &stage in stages {
        let g: &StageGraph = graph.stage(stage);
        out.push_str(&format!(
            "{stage} stage — start order, one layer per line:\n"
        ));
        for (i, layer) in g.layers()?.iter().enumerate() {
            out.push_str(&format!("  {i}: {}\n", layer.join(", ")));
        }
        if g.edges().is_empty() {
            out.push_str("  (no edges)\n");
        }
        for e in g.edges() {
            out.push_str(&format!(
                "  {} -> {}  [{}]\n",
                e.consumer,
                e.producer,
                edge_label(e.kind.as_str(), &e.endpoints, &e.origin)
            ));
        }
        for e in g.members() {
            out.push_str(&format!(
                "  {} ~> {}  [{}; joins the run, no startup wait: {} depends on {}]\n",
                e.consumer,
                e.producer,
                edge_label("reference", &e.endpoints, &e.origin),
                e.producer,
                e.consumer
            ));
        }
    }
    if !graph.external_edges().is_empty() {
        out.push_str("external (in no stage: never started or waited for):\n");
        for e in graph.external_edges() {
            let note = if graph.superseded().contains(e) {
                "  (superseded by an ${endpoint} reference: runs first)"
            } else {
                ""
            };
            out.push_str(&format!("  {} -> {}{note}\n", e.consumer, e.producer));
        }
    }
    Ok(out)
}

fn dot_id(text: &str) -> String {
    format!("\"{}\"", text.replace('\\', "\\\\").replace('"', "\\\""))
}

pub fn graph_dot(graph: &DependencyGraph, stages: &[Stage]) -> String {
    let mut out = String::from("digraph flow {\n  rankdir=LR;\n  node [shape=box];\n");
    let clustered = stages.len() > 1;
    let node = |stage: Stage, name: &str| {
        if clustered {
            dot_id(&format!("{stage}:{name}"))
        } else {
            dot_id(name)
        }
    };
    for &stage in stages {
        let g = graph.stage(stage);
        let indent = if clustered { "    " } else { "  " };
        if clustered {
            out.push_str(&format!(
                "  subgraph cluster_{stage} {{\n    label={};\n",
                dot_id(&format!("{stage} stage"))
            ));
        }
        for n in g.nodes() {
            out.push_str(&format!(
                "{indent}{} [label={}];\n",
                node(stage, n),
                dot_id(n)
            ));
        }
        for e in g.members() {
            out.push_str(&format!(
                "{indent}{} -> {} [label={}, style=dashed, constraint=false];\n",
                node(stage, &e.consumer),
                node(stage, &e.producer),
                dot_id(&edge_label(
                    "reference, no startup wait",
                    &e.endpoints,
                    &e.origin
                ))
            ));
        }
        for e in g.edges() {
            let style = match e.kind.as_str() {
                "completion" => ", style=dashed",
                "build" | "schema" => ", style=dotted",
                _ => "",
            };
            out.push_str(&format!(
                "{indent}{} -> {} [label={}{style}];\n",
                node(stage, &e.consumer),
                node(stage, &e.producer),
                dot_id(&edge_label(e.kind.as_str(), &e.endpoints, &e.origin))
            ));
        }
        if clustered {
            out.push_str("  }\n");
        }
    }
    for e in graph.external_edges() {
        let consumer = node(*stages.last().unwrap_or(&Stage::Run), &e.consumer);
        out.push_str(&format!(
            "  {} [label={}, shape=ellipse, style=dashed];\n  {consumer} -> {} [label=\"external\", style=dashed, color=gray];\n",
            dot_id(&format!("external:{}", e.producer)),
            dot_id(&e.producer),
            dot_id(&format!("external:{}", e.producer)),
        ));
    }
    out.push_str("}\n");
    out
}
