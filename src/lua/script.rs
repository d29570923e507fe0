//! Loading a script file into a [`Vm`] and finding its extension table.
//!
//! Two forms work everywhere: a global table (`tool = {...}`) or a chunk that returns the table
//! (`local ext = {} ... return ext`).

use mlua::{Function, IntoLuaMulti, Table, Value};

use super::{ScriptError, Vm};

impl Vm {
    /// Reads and runs the script file, then returns its extension table: the value the chunk
    /// returned if it is a table, else the global named `global` (`tool`, `connector`, `agent`).
    pub fn load_extension(&self, global: &str) -> Result<Table, ScriptError> {
        let info = &self.state().info;
        let source = std::fs::read(&info.path).map_err(|e| ScriptError::Unreadable {
            path: info.display_path.clone(),
            message: match e.kind() {
                std::io::ErrorKind::NotFound => "no such file".to_string(),
                _ => e.to_string(),
            },
        })?;
        self.load_extension_from(&source, global)
    }

    /// Like [`Vm::load_extension`], from source text already in memory.
    pub fn load_extension_from(&self, source: &[u8], global: &str) -> Result<Table, ScriptError> {
        let info = &self.state().info;
        let chunk =
            self.lua().load(source).set_name(format!("@{}", info.display_path)).set_mode(mlua::chunk::ChunkMode::Text);
        let returned: Value = chunk.call(()).map_err(|e| self.classify(&e))?;
        match returned {
            Value::Table(table) => Ok(table),
            Value::Nil => match self.lua().globals().get::<Value>(global) {
                Ok(Value::Table(table)) => Ok(table),
                _ => Err(ScriptError::Contract {
                    path: info.display_path.clone(),
                    message: format!("the script must define a global `{global}` table or `return` one"),
                }),
            },
            other => Err(ScriptError::Contract {
                path: info.display_path.clone(),
                message: format!("the script returned a {} where a `{global}` table was expected", other.type_name()),
            }),
        }
    }

    /// The function `ext.<name>`, or a contract error naming it.
    pub fn function(&self, ext: &Table, global: &str, name: &str) -> Result<Function, ScriptError> {
        match ext.get::<Value>(name) {
            Ok(Value::Function(f)) => Ok(f),
            Ok(Value::Nil) | Err(_) => Err(ScriptError::Contract {
                path: self.state().info.display_path.clone(),
                message: format!("`{global}.{name}` is not defined; write `function {global}.{name}(...) ... end`"),
            }),
            Ok(other) => Err(ScriptError::Contract {
                path: self.state().info.display_path.clone(),
                message: format!("`{global}.{name}` must be a function, not a {}", other.type_name()),
            }),
        }
    }

    /// Calls a script function under the VM's limits.
    pub fn call(&self, function: &Function, args: impl IntoLuaMulti) -> Result<Value, ScriptError> {
        function.call::<Value>(args).map_err(|e| self.classify(&e))
    }
}
