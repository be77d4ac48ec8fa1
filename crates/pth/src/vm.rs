//! The restricted unpickler's machine: a stack, MARKs and a memo, every opcode a state_dict's
//! pickle uses (and only those), each bound checked as it is reached. The calls it may make
//! (`REDUCE`, `BUILD`, persistent ids) are in `rebuild.rs`.
use std::collections::HashMap;
use std::rc::Rc;

use crate::limits::{MAX_MARKS, MAX_MEMO, MAX_VALUES};
use crate::values::{opcode_name, resolve_global, Fail, Obj, V};

pub(crate) struct Vm<'a> {
    data: &'a [u8],
    pub(crate) pos: usize,
    pub(crate) stack: Vec<V>,
    pub(crate) marks: Vec<usize>,
    pub(crate) memo: HashMap<u32, V>,
    pub(crate) objs: Vec<Obj>,
    pushed: usize,
}

impl<'a> Vm<'a> {
    pub(crate) fn new(data: &'a [u8]) -> Vm<'a> {
        Vm {
            data,
            pos: 0,
            stack: Vec::new(),
            marks: Vec::new(),
            memo: HashMap::new(),
            objs: Vec::new(),
            pushed: 0,
        }
    }

    pub(crate) fn corrupt<T>(&self, what: impl std::fmt::Display) -> Result<T, Fail> {
        Err(Fail::Corrupt(format!("data.pkl byte {}: {what}", self.pos)))
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8], Fail> {
        match self.pos.checked_add(n) {
            Some(end) if end <= self.data.len() => {
                let s = &self.data[self.pos..end];
                self.pos = end;
                Ok(s)
            }
            _ => self.corrupt("the pickle ends early"),
        }
    }

    fn u8(&mut self) -> Result<u8, Fail> {
        Ok(self.take(1)?[0])
    }

    fn le<const N: usize>(&mut self) -> Result<[u8; N], Fail> {
        let mut a = [0u8; N];
        a.copy_from_slice(self.take(N)?);
        Ok(a)
    }

    fn line(&mut self) -> Result<&'a str, Fail> {
        let rest = &self.data[self.pos..];
        let Some(n) = rest.iter().take(1024).position(|&b| b == b'\n') else {
            return self.corrupt("a GLOBAL name without its end");
        };
        let s = std::str::from_utf8(&rest[..n]).or_else(|_| self.corrupt("a non-UTF-8 name"))?;
        self.pos += n + 1;
        Ok(s)
    }

    fn string(&mut self, n: usize) -> Result<V, Fail> {
        let b = self.take(n)?;
        match std::str::from_utf8(b) {
            Ok(s) => Ok(V::Str(Rc::from(s))),
            Err(_) => self.corrupt("a string that is not UTF-8"),
        }
    }

    fn push(&mut self, v: V) -> Result<(), Fail> {
        self.pushed += 1;
        if self.pushed > MAX_VALUES {
            return Err(Fail::Limit(format!(
                "the pickle's number of values (more than {MAX_VALUES})"
            )));
        }
        self.stack.push(v);
        Ok(())
    }

    fn new_obj(&mut self, o: Obj) -> Result<(), Fail> {
        self.objs.push(o);
        self.push(V::Obj(self.objs.len() - 1))
    }

    fn new_dict(&mut self) -> Result<(), Fail> {
        self.new_obj(Obj::Dict {
            items: Vec::new(),
            by_str: HashMap::new(),
        })
    }

    fn pop(&mut self) -> Result<V, Fail> {
        let floor = self.marks.last().copied().unwrap_or(0);
        if self.stack.len() <= floor {
            return self.corrupt("a value is popped from an empty stack");
        }
        match self.stack.pop() {
            Some(v) => Ok(v),
            None => self.corrupt("a value is popped from an empty stack"),
        }
    }

    fn pop_mark(&mut self) -> Result<Vec<V>, Fail> {
        let Some(m) = self.marks.pop() else {
            return self.corrupt("no MARK to close");
        };
        if m > self.stack.len() {
            return self.corrupt("a MARK below the stack");
        }
        Ok(self.stack.split_off(m))
    }

    fn memo_put(&mut self, idx: u32) -> Result<(), Fail> {
        let Some(top) = self.stack.last().cloned() else {
            return self.corrupt("PUT on an empty stack");
        };
        if self.memo.len() >= MAX_MEMO && !self.memo.contains_key(&idx) {
            return Err(Fail::Limit(format!(
                "the pickle's memo (more than {MAX_MEMO} entries)"
            )));
        }
        self.memo.insert(idx, top);
        Ok(())
    }

    fn memo_get(&mut self, idx: u32) -> Result<(), Fail> {
        match self.memo.get(&idx).cloned() {
            Some(v) => self.push(v),
            None => self.corrupt(format!("GET of memo entry {idx}, which was never PUT")),
        }
    }

    pub(crate) fn tuple(&self, v: &V) -> Option<&'_ [V]> {
        match v {
            V::Obj(i) => match self.objs.get(*i) {
                Some(Obj::Tuple(t)) => Some(t),
                _ => None,
            },
            _ => None,
        }
    }

    pub(crate) fn describe(&self, v: &V) -> &'static str {
        match v {
            V::None => "None",
            V::Bool(_) => "a bool",
            V::Int(_) => "an int",
            V::Float(_) => "a float",
            V::Str(_) => "a string",
            V::Obj(i) => match self.objs.get(*i) {
                Some(Obj::Tuple(_)) => "a tuple",
                Some(Obj::List(_)) => "a list",
                _ => "a dict",
            },
            V::Global(_) => "a type",
            V::Storage(_) => "a storage",
            V::Tensor(_) => "a tensor",
        }
    }

    /// Top of the stack as a dict (SETITEM(S), BUILD).
    fn top_dict(&mut self) -> Result<&mut Obj, Fail> {
        let id = match self.stack.last() {
            Some(V::Obj(i)) => *i,
            _ => return self.corrupt("SETITEM on something that is not a dict"),
        };
        match self.objs.get_mut(id) {
            Some(d @ Obj::Dict { .. }) => Ok(d),
            _ => Err(Fail::Corrupt(
                "data.pkl: SETITEM on something that is not a dict".into(),
            )),
        }
    }

    fn set_items(&mut self, kv: Vec<V>) -> Result<(), Fail> {
        if kv.len() & 1 != 0 {
            return self.corrupt("SETITEMS with a key and no value");
        }
        let Obj::Dict { items, by_str } = self.top_dict()? else {
            return Err(Fail::Corrupt("data.pkl: SETITEM on a non-dict".into()));
        };
        let mut it = kv.into_iter();
        while let (Some(k), Some(v)) = (it.next(), it.next()) {
            if let V::Str(s) = &k {
                if let Some(&at) = by_str.get(s) {
                    items[at].1 = v;
                    continue;
                }
                by_str.insert(s.clone(), items.len());
            }
            items.push((k, v));
        }
        Ok(())
    }

    fn append(&mut self, vs: Vec<V>) -> Result<(), Fail> {
        let id = match self.stack.last() {
            Some(V::Obj(i)) => *i,
            _ => return self.corrupt("APPEND to something that is not a list"),
        };
        match self.objs.get_mut(id) {
            Some(Obj::List(l)) => {
                l.extend(vs);
                Ok(())
            }
            _ => self.corrupt("APPEND to something that is not a list"),
        }
    }

    /// Runs the pickle to its STOP; the object it built.
    pub(crate) fn run(&mut self) -> Result<V, Fail> {
        loop {
            let at = self.pos;
            let op = self.u8()?;
            if let Some(v) = self.step(at, op)? {
                return Ok(v);
            }
        }
    }

    /// One opcode (read at `at`): protocol, containers, strings, globals, calls and STOP here;
    /// numbers, constants and the memo in [`Vm::scalar_or_memo`]. The built object at STOP.
    fn step(&mut self, at: usize, op: u8) -> Result<Option<V>, Fail> {
        match op {
            0x80 => {
                let proto = self.u8()?;
                if proto > 5 {
                    return self.corrupt(format!("pickle protocol {proto}"));
                }
            }
            0x95 => {
                self.take(8)?; // FRAME: a length hint
            }
            b'}' => self.new_dict()?,
            b']' => self.new_obj(Obj::List(Vec::new()))?,
            b')' => self.new_obj(Obj::Tuple(Vec::new()))?,
            b'(' => {
                if self.marks.len() >= MAX_MARKS {
                    return Err(Fail::Limit(format!(
                        "the pickle's nesting (more than {MAX_MARKS} MARKs)"
                    )));
                }
                self.marks.push(self.stack.len());
            }
            b'X' => {
                let n = u32::from_le_bytes(self.le()?) as usize;
                let s = self.string(n)?;
                self.push(s)?;
            }
            0x8c => {
                let n = self.u8()? as usize;
                let s = self.string(n)?;
                self.push(s)?;
            }
            0x8d => {
                let n = u64::from_le_bytes(self.le()?);
                let n = usize::try_from(n).unwrap_or(usize::MAX);
                let s = self.string(n)?;
                self.push(s)?;
            }
            b'c' => {
                let module = self.line()?;
                let name = self.line()?;
                let g = resolve_global(module, name)?;
                self.push(V::Global(g))?;
            }
            0x93 => {
                let name = self.pop()?;
                let module = self.pop()?;
                let (V::Str(module), V::Str(name)) = (module, name) else {
                    return self.corrupt("STACK_GLOBAL of values that are not strings");
                };
                let g = resolve_global(&module, &name)?;
                self.push(V::Global(g))?;
            }
            b'Q' => {
                let pid = self.pop()?;
                let s = self.persistent_load(&pid)?;
                self.push(V::Storage(Rc::new(s)))?;
            }
            b't' => {
                let items = self.pop_mark()?;
                self.new_obj(Obj::Tuple(items))?;
            }
            0x85..=0x87 => {
                let n = (op - 0x84) as usize;
                let floor = self.marks.last().copied().unwrap_or(0);
                if self.stack.len() < floor + n {
                    return self.corrupt("TUPLE of missing values");
                }
                let items = self.stack.split_off(self.stack.len() - n);
                self.new_obj(Obj::Tuple(items))?;
            }
            b'R' | 0x81 => {
                let args = self.pop()?;
                let callable = self.pop()?;
                let v = self.reduce(&callable, &args)?;
                self.push(v)?;
            }
            b'b' => {
                let state = self.pop()?;
                self.build(&state)?;
            }
            b's' => {
                let v = self.pop()?;
                let k = self.pop()?;
                self.set_items(vec![k, v])?;
            }
            b'u' => {
                let kv = self.pop_mark()?;
                self.set_items(kv)?;
            }
            b'a' => {
                let v = self.pop()?;
                self.append(vec![v])?;
            }
            b'e' => {
                let vs = self.pop_mark()?;
                self.append(vs)?;
            }
            b'.' => {
                return match self.stack.pop() {
                    Some(v) => Ok(Some(v)),
                    None => self.corrupt("STOP with an empty stack"),
                };
            }
            _ => self.scalar_or_memo(at, op)?,
        }
        Ok(None)
    }

    /// Numbers, booleans, `None` and the memo's PUT/GET; any other opcode is refused by name.
    fn scalar_or_memo(&mut self, at: usize, op: u8) -> Result<(), Fail> {
        match op {
            b'J' => {
                let v = i32::from_le_bytes(self.le()?);
                self.push(V::Int(v as i64))?;
            }
            b'K' => {
                let v = self.u8()?;
                self.push(V::Int(v as i64))?;
            }
            b'M' => {
                let v = u16::from_le_bytes(self.le()?);
                self.push(V::Int(v as i64))?;
            }
            0x8a => {
                let n = self.u8()? as usize;
                if n > 8 {
                    return self.corrupt(format!("an integer of {n} bytes"));
                }
                let b = self.take(n)?;
                let mut a = if b.last().is_some_and(|&x| x & 0x80 != 0) {
                    [0xffu8; 8]
                } else {
                    [0u8; 8]
                };
                a[..n].copy_from_slice(b);
                self.push(V::Int(i64::from_le_bytes(a)))?;
            }
            b'G' => {
                let v = f64::from_be_bytes(self.le()?);
                self.push(V::Float(v))?;
            }
            0x88 => self.push(V::Bool(true))?,
            0x89 => self.push(V::Bool(false))?,
            b'N' => self.push(V::None)?,
            b'q' => {
                let i = self.u8()? as u32;
                self.memo_put(i)?;
            }
            b'r' => {
                let i = u32::from_le_bytes(self.le()?);
                self.memo_put(i)?;
            }
            0x94 => {
                let i = u32::try_from(self.memo.len()).unwrap_or(u32::MAX);
                self.memo_put(i)?;
            }
            b'h' => {
                let i = self.u8()? as u32;
                self.memo_get(i)?;
            }
            b'j' => {
                let i = u32::from_le_bytes(self.le()?);
                self.memo_get(i)?;
            }
            _ => {
                self.pos = at;
                return self.corrupt(format!(
                    "pickle opcode 0x{op:02x} ({}), which a state_dict saved by torch.save \
                     does not use",
                    opcode_name(op)
                ));
            }
        }
        Ok(())
    }
}
