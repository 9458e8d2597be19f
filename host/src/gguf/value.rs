//! GGUF metadata values.
use std::fmt;

#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    F32(f32),
    Bool(bool),
    String(String),
    Array(Vec<Value>),
    U64(u64),
    I64(i64),
    F64(f64),
}

impl Value {
    /// The GGUF value type id.
    pub fn type_id(&self) -> u32 {
        match self {
            Value::U8(_) => 0,
            Value::I8(_) => 1,
            Value::U16(_) => 2,
            Value::I16(_) => 3,
            Value::U32(_) => 4,
            Value::I32(_) => 5,
            Value::F32(_) => 6,
            Value::Bool(_) => 7,
            Value::String(_) => 8,
            Value::Array(_) => 9,
            Value::U64(_) => 10,
            Value::I64(_) => 11,
            Value::F64(_) => 12,
        }
    }

    pub fn type_name(type_id: u32) -> &'static str {
        match type_id {
            0 => "u8",
            1 => "i8",
            2 => "u16",
            3 => "i16",
            4 => "u32",
            5 => "i32",
            6 => "f32",
            7 => "bool",
            8 => "string",
            9 => "array",
            10 => "u64",
            11 => "i64",
            12 => "f64",
            _ => "unknown",
        }
    }

    /// The value as an unsigned integer, when it is one of the integer types and not negative.
    pub fn as_u64(&self) -> Option<u64> {
        match *self {
            Value::U8(v) => Some(v as u64),
            Value::U16(v) => Some(v as u64),
            Value::U32(v) => Some(v as u64),
            Value::U64(v) => Some(v),
            Value::I8(v) => u64::try_from(v).ok(),
            Value::I16(v) => u64::try_from(v).ok(),
            Value::I32(v) => u64::try_from(v).ok(),
            Value::I64(v) => u64::try_from(v).ok(),
            _ => None,
        }
    }

    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::String(s) => Some(s),
            _ => None,
        }
    }
}

/// Values print as `strata info` shows them: arrays by element type and length with the first
/// few elements, long strings cut.
impl fmt::Display for Value {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Value::U8(v) => write!(f, "{v}"),
            Value::I8(v) => write!(f, "{v}"),
            Value::U16(v) => write!(f, "{v}"),
            Value::I16(v) => write!(f, "{v}"),
            Value::U32(v) => write!(f, "{v}"),
            Value::I32(v) => write!(f, "{v}"),
            Value::F32(v) => write!(f, "{v}"),
            Value::Bool(v) => write!(f, "{v}"),
            Value::U64(v) => write!(f, "{v}"),
            Value::I64(v) => write!(f, "{v}"),
            Value::F64(v) => write!(f, "{v}"),
            Value::String(s) if s.chars().count() > 80 => write!(f, "{:?}... ({} bytes)", s.chars().take(80).collect::<String>(), s.len()),
            Value::String(s) => write!(f, "{s:?}"),
            Value::Array(items) => {
                let ty = items.first().map_or("?", |v| Value::type_name(v.type_id()));
                write!(f, "[{ty}; {}] [", items.len())?;
                for (i, v) in items.iter().take(6).enumerate() {
                    write!(f, "{}{v}", if i > 0 { ", " } else { "" })?;
                }
                write!(f, "{}]", if items.len() > 6 { ", ..." } else { "" })
            }
        }
    }
}
