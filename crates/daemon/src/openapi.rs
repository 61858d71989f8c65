//! `/openapi.json`: the routes this daemon really serves.

use serde_json::{json, Value};

pub fn document() -> Value {
    let error = json!({ "description": "error", "content": { "application/json": { "schema": { "$ref": "#/components/schemas/Error" } } } });
    let invoke = json!({
        "summary": "Invoke a function: the body goes to its stdin; method, path, query and headers to SKIFF_* variables",
        "parameters": [{ "name": "name", "in": "path", "required": true, "schema": { "type": "string" } }],
        "requestBody": { "content": { "application/octet-stream": {} } },
        "responses": {
            "200": { "description": "the function's stdout" },
            "404": error, "413": error, "501": error, "502": error, "503": error, "504": error
        }
    });
    let invoke_ops =
        json!({ "get": invoke, "post": invoke, "put": invoke, "delete": invoke, "patch": invoke });
    json!({
        "openapi": "3.0.3",
        "info": { "title": "skiff", "version": env!("CARGO_PKG_VERSION") },
        "paths": {
            "/healthz": { "get": { "summary": "Liveness", "responses": { "200": { "description": "ok" } } } },
            "/metrics": { "get": { "summary": "Prometheus metrics", "responses": { "200": { "description": "text/plain" } } } },
            "/openapi.json": { "get": { "summary": "This document", "responses": { "200": { "description": "OpenAPI 3" } } } },
            "/v1/functions": {
                "get": { "summary": "List functions", "responses": { "200": { "description": "functions", "content": { "application/json": { "schema": { "type": "array", "items": { "$ref": "#/components/schemas/Function" } } } } } } },
                "post": {
                    "summary": "Deploy a function: a tar of its directory (with skiff.yaml)",
                    "requestBody": { "required": true, "content": { "application/x-tar": {} } },
                    "responses": { "201": { "description": "deployed", "content": { "application/json": { "schema": { "$ref": "#/components/schemas/Function" } } } }, "400": error, "413": error }
                }
            },
            "/v1/functions/{name}": {
                "parameters": [{ "name": "name", "in": "path", "required": true, "schema": { "type": "string" } }],
                "get": { "summary": "Describe a function", "responses": { "200": { "description": "the function", "content": { "application/json": { "schema": { "$ref": "#/components/schemas/Function" } } } }, "404": error } },
                "delete": { "summary": "Delete a function", "responses": { "204": { "description": "deleted" }, "404": error } }
            },
            "/fn/{name}": invoke_ops,
            "/function/{name}": invoke_ops
        },
        "components": { "schemas": {
            "Error": { "type": "object", "properties": { "error": { "type": "string" } }, "required": ["error"] },
            "Function": { "type": "object", "properties": {
                "name": { "type": "string" }, "runtime": { "type": "string" }, "handler": { "type": "string" },
                "env": { "type": "string" }, "memory_bytes": { "type": "integer" }, "cpus": { "type": "number" },
                "pids": { "type": "integer" }, "timeout_ms": { "type": "integer" }, "deployed_unix": { "type": "integer" }
            } }
        } }
    })
}
