//! The Argo CD health-script runner shared by tests/argocd_health.rs (statuses built from the
//! operator's types) and tests/integration/gitops.rs (statuses the controllers wrote on the
//! bed): both include this file with `#[path]`, so the two judge with the same runner.
//!
//! Argo CD runs health scripts in gopher-lua (Lua 5.1, numbers are floats) with only the base,
//! package and table libraries and a safe `os` (`util/lua/lua.go`, SkipOpenLibs); this runner
//! opens the same set (mlua's `os` is the full one, a superset: the scripts call none of it).
//! Exact verdicts come from gopher-lua itself, in tests/verdicts (tests/integration/gitops.rs).

use std::path::{Path, PathBuf};

use mlua::{Lua, LuaOptions, StdLib, Value as LuaValue};
use serde_json::Value;

pub fn argocd_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/argocd")
}

/// tests/fixtures/argocd: objects the controllers wrote on the bed, with the verdict they got
/// (recorded by tests/integration/gitops.rs with ARTEMIS_STUDIO_RECORD_ARGOCD=1).
#[allow(dead_code)] // the integration tests write them, the unit test reads them
pub fn argocd_fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/argocd")
}

/// deploy/argocd/health/<kind>.lua
pub fn script(kind: &str) -> String {
    let path = argocd_dir().join("health").join(format!("{kind}.lua"));
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// JSON to Lua as Argo CD hands an object to a health script: numbers are Lua numbers (gopher-lua
/// has no integer type), and no nulls (the API server prunes them from custom resources).
fn to_lua(lua: &Lua, v: &Value) -> mlua::Result<LuaValue> {
    Ok(match v {
        Value::Null => LuaValue::Nil,
        Value::Bool(b) => LuaValue::Boolean(*b),
        Value::Number(n) => LuaValue::Number(n.as_f64().unwrap_or(f64::NAN)),
        Value::String(s) => LuaValue::String(lua.create_string(s)?),
        Value::Array(items) => {
            let t = lua.create_table()?;
            for (i, x) in items.iter().enumerate() {
                t.raw_set(i + 1, to_lua(lua, x)?)?;
            }
            LuaValue::Table(t)
        }
        Value::Object(fields) => {
            let t = lua.create_table()?;
            for (k, x) in fields.iter().filter(|(_, x)| !x.is_null()) {
                t.raw_set(k.as_str(), to_lua(lua, x)?)?;
            }
            LuaValue::Table(t)
        }
    })
}

/// Run the health script of the object's kind on it; returns (status, message).
pub fn health(obj: &Value) -> (String, String) {
    let kind = obj["kind"].as_str().expect("kind");
    // Only the libraries Argo CD opens for health scripts (util/lua/lua.go: package, base,
    // table and a safe os; `string` and `math` only with useOpenLibs): mlua always opens base.
    let lua = Lua::new_with(
        StdLib::TABLE | StdLib::PACKAGE | StdLib::OS,
        LuaOptions::default(),
    )
    .expect("lua");
    lua.globals()
        .set("obj", to_lua(&lua, obj).expect("to lua"))
        .expect("set obj");
    let hs: mlua::Table = lua
        .load(script(kind))
        .set_name(kind)
        .eval()
        .unwrap_or_else(|e| panic!("{kind}.lua failed: {e}"));
    let status: String = hs.get("status").expect("hs.status");
    let message: String = hs.get("message").expect("hs.message");
    assert!(
        [
            "Healthy",
            "Progressing",
            "Degraded",
            "Suspended",
            "Missing",
            "Unknown"
        ]
        .contains(&status.as_str()),
        "{kind}: {status} is not an Argo CD health status"
    );
    (status, message)
}
