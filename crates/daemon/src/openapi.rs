//! `/openapi.json`: the routes this daemon really serves.

use serde_json::{json, Value};

fn name_param() -> Value {
    path_param("name")
}

/// A name or an id: one character set for both (`names::check`).
fn path_param(name: &str) -> Value {
    json!({ "name": name, "in": "path", "required": true, "schema": { "type": "string", "pattern": "^[a-z0-9][a-z0-9-]{0,62}$" } })
}

fn json_of(schema: &str) -> Value {
    json!({ "application/json": { "schema": { "$ref": format!("#/components/schemas/{schema}") } } })
}

pub fn document() -> Value {
    let error = json!({ "description": "error", "content": json_of("Error") });
    let mut document = paths(&error);
    // A route that takes a name or an id answers 400 for one that is not one.
    for (path, operations) in document["paths"].as_object_mut().expect("paths") {
        if path.contains('{') {
            for operation in operations.as_object_mut().expect("operations").values_mut() {
                if let Some(responses) = operation.get_mut("responses") {
                    responses["400"] = error.clone();
                }
            }
        }
    }
    document
}

fn paths(error: &Value) -> Value {
    let invoke = json!({
        "summary": "Invoke a function. python3/node: the handler gets the body as its event and method, path, query and headers in its context; binary: the body on stdin, SKIFF_* variables",
        "parameters": [name_param()],
        "requestBody": { "content": { "application/octet-stream": {} } },
        "responses": {
            "200": { "description": "the function's response (its status and headers); x-skiff-invocation-id, and x-skiff-cold-start on a cold start" },
            "400": error, "404": error, "408": error, "413": error, "429": error, "500": error, "502": error, "503": error, "504": error
        }
    });
    let invoke_ops =
        json!({ "get": invoke, "post": invoke, "put": invoke, "delete": invoke, "patch": invoke });
    let accepted = json!({
        "summary": "Invoke asynchronously; X-Callback-Url (http) receives the result",
        "parameters": [name_param()],
        "responses": { "202": { "description": "accepted: {id}; x-call-id and location headers" }, "400": error, "404": error, "408": error, "413": error }
    });
    json!({
        "openapi": "3.0.3",
        "info": { "title": "skiff", "version": env!("CARGO_PKG_VERSION") },
        "paths": {
            "/healthz": { "get": { "summary": "Liveness and the data directory", "responses": { "200": { "description": "ok" } } } },
            "/metrics": { "get": { "summary": "Prometheus metrics", "responses": { "200": { "description": "text/plain" } } } },
            "/openapi.json": { "get": { "summary": "This document", "responses": { "200": { "description": "OpenAPI 3" } } } },
            "/v1/functions": {
                "get": { "summary": "List functions", "responses": { "200": { "description": "functions", "content": { "application/json": { "schema": { "type": "array", "items": { "$ref": "#/components/schemas/Function" } } } } } } },
                "post": {
                    "summary": "Deploy a function: a tar of its directory (with skiff.yaml), or ?path=DIR on the Unix socket",
                    "parameters": [{ "name": "path", "in": "query", "schema": { "type": "string" } }],
                    "requestBody": { "content": { "application/x-tar": {} } },
                    "responses": { "201": { "description": "deployed", "content": json_of("Function") }, "400": error, "403": error, "408": error, "413": error }
                }
            },
            "/v1/functions/{name}": {
                "parameters": [name_param()],
                "get": { "summary": "Describe a function and its instances", "responses": { "200": { "description": "the function", "content": json_of("Function") }, "404": error } },
                "delete": { "summary": "Delete a function", "responses": { "204": { "description": "deleted" }, "404": error } }
            },
            "/v1/functions/{name}/instances": {
                "parameters": [name_param()],
                "delete": { "summary": "Scale to zero now: idle instances end", "responses": { "200": { "description": "{stopped}" }, "404": error } }
            },
            "/v1/functions/{name}/logs": {
                "parameters": [name_param(),
                    { "name": "tail", "in": "query", "schema": { "type": "integer" } },
                    { "name": "invocation", "in": "query", "schema": { "type": "string" } },
                    { "name": "follow", "in": "query", "schema": { "type": "boolean" } }],
                "get": { "summary": "Log lines as JSON lines (ts, invocation, stream, line)", "responses": { "200": { "description": "application/x-ndjson" }, "404": error } }
            },
            "/v1/instances": { "get": { "summary": "Running instances", "responses": { "200": { "description": "instances" } } } },
            "/v1/invocations": {
                "get": {
                    "summary": "Invocation records, newest first",
                    "parameters": [{ "name": "function", "in": "query", "schema": { "type": "string" } }, { "name": "limit", "in": "query", "schema": { "type": "integer" } }],
                    "responses": { "200": { "description": "records", "content": { "application/json": { "schema": { "type": "array", "items": { "$ref": "#/components/schemas/Invocation" } } } } } }
                }
            },
            "/v1/invocations/{id}": {
                "parameters": [path_param("id")],
                "get": { "summary": "One invocation's record (an async one with its result)", "responses": { "200": { "description": "the record", "content": json_of("Invocation") }, "404": error } }
            },
            "/v1/sessions": {
                "get": { "summary": "Sessions, live or checkpointed: id, function, workers, in flight, idle, bytes on disk", "responses": { "200": { "description": "the sessions" } } }
            },
            "/v1/sessions/{id}": {
                "parameters": [path_param("id")],
                "delete": { "summary": "End a session and delete its state", "responses": { "204": { "description": "deleted" }, "404": error } }
            },
            "/v1/sessions/{id}/state": {
                "parameters": [path_param("id")],
                "get": { "summary": "The session's keys and values (restored if needed)", "responses": { "200": { "description": "[{key, value, bytes}]" }, "404": error } }
            },
            "/v1/sessions/{id}/checkpoint": {
                "parameters": [path_param("id")],
                "post": { "summary": "Write the session's checkpoint now", "responses": { "200": { "description": "{keys, bytes, ms}" }, "404": error } }
            },
            "/v1/sessions/{id}/close": {
                "parameters": [path_param("id")],
                "post": { "summary": "Checkpoint the session and end its workers; the next request restores it", "responses": { "204": { "description": "closed" }, "404": error } }
            },
            "/fn/{name}": invoke_ops,
            "/fn/{name}/{path}": invoke_ops,
            "/function/{name}": invoke_ops,
            "/function/{name}/{path}": invoke_ops,
            "/async/{name}": { "post": accepted },
            "/async-function/{name}": { "post": accepted }
        },
        "components": { "schemas": {
            "Error": { "type": "object", "properties": { "error": { "type": "string" } }, "required": ["error"] },
            "Function": { "type": "object", "properties": {
                "name": { "type": "string" }, "runtime": { "type": "string" }, "handler": { "type": "string" },
                "env": { "type": "string" }, "memory_bytes": { "type": "integer" }, "cpus": { "type": "number" },
                "pids": { "type": "integer" }, "timeout_ms": { "type": "integer" }, "vars": { "type": "object" },
                "network": { "type": "string" }, "scale": { "type": "object" }, "deployed_unix": { "type": "integer" }
            } },
            "Invocation": { "type": "object", "properties": {
                "id": { "type": "string" }, "function": { "type": "string" }, "async": { "type": "boolean" },
                "status": { "type": "string", "enum": ["queued", "running", "succeeded", "failed"] },
                "http_status": { "type": "integer" }, "start": { "type": "string" }, "end": { "type": "string" },
                "cold_start": { "type": "boolean" }, "init_ms": { "type": "number" }, "queue_ms": { "type": "number" },
                "duration_ms": { "type": "number" }, "instance": { "type": "string" }, "error": { "type": "string" },
                "logs": { "type": "array", "items": { "type": "string" } }, "result": { "type": "string" },
                "result_base64": { "type": "string" }
            } }
        } }
    })
}
