//! Carrying out an [`Emulation`] on a register file (pure over the [`Cpu`] trait, so the
//! semantics are unit-tested on a fake; the trap path implements it on the signal context).

use iced_x86::{ConditionCode, Register};

use crate::insn::decode::Emulation;

pub const CF: u64 = 1 << 0;
pub const PF: u64 = 1 << 2;
pub const AF: u64 = 1 << 4;
pub const ZF: u64 = 1 << 6;
pub const SF: u64 = 1 << 7;
pub const OF: u64 = 1 << 11;

/// What an emulated instruction may read and change.
pub trait Cpu {
    /// A 64-bit general register.
    fn reg(&self, reg: Register) -> u64;
    fn set_reg(&mut self, reg: Register, value: u64);
    fn flags(&self) -> u64;
    fn set_flags(&mut self, value: u64);
    fn set_rip(&mut self, value: u64);
    /// The base of FS or GS (ES, CS, SS and DS are flat).
    fn segment_base(&self, seg: Register) -> u64;
    fn read_u64(&self, addr: u64) -> u64;
    fn write_u64(&mut self, addr: u64, value: u64);
}

fn push(cpu: &mut impl Cpu, value: u64) {
    let rsp = cpu.reg(Register::RSP).wrapping_sub(8);
    cpu.write_u64(rsp, value);
    cpu.set_reg(Register::RSP, rsp);
}

/// Whether condition `cond` holds under `flags`.
pub fn condition_holds(cond: ConditionCode, flags: u64) -> bool {
    let f = |bit| flags & bit != 0;
    match cond {
        ConditionCode::None => true,
        ConditionCode::o => f(OF),
        ConditionCode::no => !f(OF),
        ConditionCode::b => f(CF),
        ConditionCode::ae => !f(CF),
        ConditionCode::e => f(ZF),
        ConditionCode::ne => !f(ZF),
        ConditionCode::be => f(CF) || f(ZF),
        ConditionCode::a => !f(CF) && !f(ZF),
        ConditionCode::s => f(SF),
        ConditionCode::ns => !f(SF),
        ConditionCode::p => f(PF),
        ConditionCode::np => !f(PF),
        ConditionCode::l => f(SF) != f(OF),
        ConditionCode::ge => f(SF) == f(OF),
        ConditionCode::le => f(ZF) || f(SF) != f(OF),
        ConditionCode::g => !f(ZF) && f(SF) == f(OF),
    }
}

/// The arithmetic flags of the 64-bit `a + b` (or `a - b`) giving `r`.
pub fn arith_flags(a: u64, b: u64, r: u64, sub: bool) -> u64 {
    let mut flags = 0;
    let carry = if sub { a < b } else { r < a };
    let overflow = if sub { (a ^ b) & (a ^ r) } else { !(a ^ b) & (a ^ r) } >> 63 != 0;
    if carry {
        flags |= CF;
    }
    if (r as u8).count_ones().is_multiple_of(2) {
        flags |= PF;
    }
    if (a ^ b ^ r) & 0x10 != 0 {
        flags |= AF;
    }
    if r == 0 {
        flags |= ZF;
    }
    if r >> 63 != 0 {
        flags |= SF;
    }
    if overflow {
        flags |= OF;
    }
    flags
}

/// Executes `e`, the instruction at `ip` whose successor is at `next`, on `cpu`.
pub fn execute(e: &Emulation, cpu: &mut impl Cpu, next: u64) {
    use Emulation::*;
    let mut rip = next;
    match *e {
        Nop => {}
        Push(reg) => {
            let value = cpu.reg(reg);
            push(cpu, value);
        }
        PushImm(value) => push(cpu, value),
        Pop(reg) => {
            let rsp = cpu.reg(Register::RSP);
            let value = cpu.read_u64(rsp);
            cpu.set_reg(Register::RSP, rsp.wrapping_add(8));
            cpu.set_reg(reg, value); // after the increment: `pop %rsp` loads the popped value
        }
        MovReg { dst, src } => {
            let value = cpu.reg(src);
            cpu.set_reg(dst, value);
        }
        AddImm { reg, imm, sub } => {
            let a = cpu.reg(reg);
            let r = if sub { a.wrapping_sub(imm) } else { a.wrapping_add(imm) };
            cpu.set_reg(reg, r);
            let keep = cpu.flags() & !(CF | PF | AF | ZF | SF | OF);
            cpu.set_flags(keep | arith_flags(a, imm, r, sub));
        }
        Jmp(target) => rip = target,
        Jcc { cond, target } => {
            if condition_holds(cond, cpu.flags()) {
                rip = target;
            }
        }
        Loop { cond, target } => {
            let rcx = cpu.reg(Register::RCX).wrapping_sub(1);
            cpu.set_reg(Register::RCX, rcx);
            if rcx != 0 && condition_holds(cond, cpu.flags()) {
                rip = target;
            }
        }
        Jrcxz(target) => {
            if cpu.reg(Register::RCX) == 0 {
                rip = target;
            }
        }
        Call(target) => {
            push(cpu, next);
            rip = target;
        }
        CallIndirect(insn) => {
            rip = indirect_target(&insn, cpu);
            push(cpu, next);
        }
        Ret(pop) => {
            let rsp = cpu.reg(Register::RSP);
            rip = cpu.read_u64(rsp);
            cpu.set_reg(Register::RSP, rsp.wrapping_add(8 + u64::from(pop)));
        }
    }
    cpu.set_rip(rip);
}

/// Where `call *operand` goes, read before the call pushes anything (so `call *(%rsp)` and
/// `call *%rsp`-relative operands see the stack as the instruction does).
fn indirect_target(insn: &iced_x86::Instruction, cpu: &impl Cpu) -> u64 {
    if insn.op0_kind() == iced_x86::OpKind::Register {
        return cpu.reg(insn.op0_register());
    }
    let addr = insn.virtual_address(0, 0, |reg, _, _| {
        Some(match reg {
            Register::ES | Register::CS | Register::SS | Register::DS => 0,
            Register::FS | Register::GS => cpu.segment_base(reg),
            Register::RIP => insn.next_ip(),
            r if r.is_gpr64() => cpu.reg(r),
            r if r.is_gpr32() => cpu.reg(r.full_register()) & 0xffff_ffff,
            _ => return None,
        })
    });
    cpu.read_u64(addr.unwrap_or(0))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::insn::decode::{decode_at, plan, Plan};
    use std::collections::HashMap;

    #[derive(Default)]
    struct Fake {
        regs: HashMap<Register, u64>,
        flags: u64,
        rip: u64,
        mem: HashMap<u64, u64>,
        fs: u64,
    }

    impl Cpu for Fake {
        fn reg(&self, reg: Register) -> u64 {
            *self.regs.get(&reg).unwrap_or(&0)
        }
        fn set_reg(&mut self, reg: Register, value: u64) {
            self.regs.insert(reg, value);
        }
        fn flags(&self) -> u64 {
            self.flags
        }
        fn set_flags(&mut self, value: u64) {
            self.flags = value;
        }
        fn set_rip(&mut self, value: u64) {
            self.rip = value;
        }
        fn segment_base(&self, seg: Register) -> u64 {
            if seg == Register::FS {
                self.fs
            } else {
                0
            }
        }
        fn read_u64(&self, addr: u64) -> u64 {
            *self.mem.get(&addr).unwrap_or(&0)
        }
        fn write_u64(&mut self, addr: u64, value: u64) {
            self.mem.insert(addr, value);
        }
    }

    fn run(bytes: &[u8], cpu: &mut Fake) {
        let insn = decode_at(bytes, 0x1000).unwrap();
        let Plan::Emulate(e) = plan(&insn).unwrap() else { panic!("not emulated") };
        execute(&e, cpu, insn.next_ip());
    }

    fn cpu_with_stack() -> Fake {
        let mut cpu = Fake::default();
        cpu.set_reg(Register::RSP, 0x8000);
        cpu
    }

    #[test]
    fn push_pop_and_mov() {
        let mut cpu = cpu_with_stack();
        cpu.set_reg(Register::RBP, 0x1234);
        run(&[0x55], &mut cpu);
        assert_eq!((cpu.reg(Register::RSP), cpu.mem[&0x7ff8], cpu.rip), (0x7ff8, 0x1234, 0x1001));
        run(&[0x48, 0x89, 0xe5], &mut cpu);
        assert_eq!(cpu.reg(Register::RBP), 0x7ff8);
        run(&[0x41, 0x5c], &mut cpu); // pop %r12
        assert_eq!((cpu.reg(Register::R12), cpu.reg(Register::RSP)), (0x1234, 0x8000));
        run(&[0x54], &mut cpu); // push %rsp pushes the old value
        assert_eq!(cpu.mem[&0x7ff8], 0x8000);
        run(&[0x5c], &mut cpu); // pop %rsp loads the popped value
        assert_eq!(cpu.reg(Register::RSP), 0x8000);
    }

    #[test]
    fn sub_and_add_on_rsp_set_flags() {
        let mut cpu = cpu_with_stack();
        cpu.flags = 0x202;
        run(&[0x48, 0x83, 0xec, 0x18], &mut cpu);
        assert_eq!(cpu.reg(Register::RSP), 0x7fe8);
        assert_eq!(cpu.flags, 0x202 | AF | PF); // 0x8000 - 0x18 = 0x7fe8
        run(&[0x48, 0x83, 0xc4, 0x18], &mut cpu);
        assert_eq!(cpu.reg(Register::RSP), 0x8000);
        assert_eq!(cpu.flags & (CF | ZF | SF | OF), 0);
        cpu.set_reg(Register::RAX, 1);
        run(&[0x48, 0x83, 0xe8, 0x01], &mut cpu); // sub $1,%rax -> 0
        assert_eq!(cpu.flags & (ZF | PF | CF), ZF | PF);
        run(&[0x48, 0x83, 0xe8, 0x01], &mut cpu); // 0 - 1 borrows
        assert_eq!(cpu.flags & (CF | SF | ZF), CF | SF);
    }

    #[test]
    fn arith_flags_match_the_hardware_rules() {
        assert_eq!(arith_flags(i64::MAX as u64, 1, i64::MIN as u64, false) & (OF | SF | CF), OF | SF);
        assert_eq!(arith_flags(u64::MAX, 1, 0, false) & (CF | ZF | OF), CF | ZF);
        assert_eq!(arith_flags(i64::MIN as u64, 1, i64::MAX as u64, true) & (OF | SF | CF), OF);
    }

    #[test]
    fn branches_calls_and_returns() {
        let mut cpu = cpu_with_stack();
        run(&[0xe8, 0x10, 0, 0, 0], &mut cpu);
        assert_eq!((cpu.rip, cpu.mem[&0x7ff8], cpu.reg(Register::RSP)), (0x1015, 0x1005, 0x7ff8));
        run(&[0xc3], &mut cpu);
        assert_eq!((cpu.rip, cpu.reg(Register::RSP)), (0x1005, 0x8000));
        cpu.mem.insert(0x8000, 0x4444);
        run(&[0xc2, 0x10, 0x00], &mut cpu);
        assert_eq!((cpu.rip, cpu.reg(Register::RSP)), (0x4444, 0x8018));
        cpu.flags = ZF;
        run(&[0x74, 0x10], &mut cpu);
        assert_eq!(cpu.rip, 0x1012);
        run(&[0x75, 0x10], &mut cpu);
        assert_eq!(cpu.rip, 0x1002);
        cpu.flags = SF;
        run(&[0x7c, 0x10], &mut cpu); // jl: SF != OF
        assert_eq!(cpu.rip, 0x1012);
        run(&[0x7f, 0x10], &mut cpu); // jg
        assert_eq!(cpu.rip, 0x1002);
        run(&[0xeb, 0xfe], &mut cpu);
        assert_eq!(cpu.rip, 0x1000);
    }

    #[test]
    fn loops_count_down_rcx() {
        let mut cpu = cpu_with_stack();
        cpu.set_reg(Register::RCX, 2);
        run(&[0xe2, 0x10], &mut cpu);
        assert_eq!((cpu.rip, cpu.reg(Register::RCX)), (0x1012, 1));
        run(&[0xe2, 0x10], &mut cpu);
        assert_eq!((cpu.rip, cpu.reg(Register::RCX)), (0x1002, 0));
        run(&[0xe3, 0x10], &mut cpu);
        assert_eq!(cpu.rip, 0x1012);
    }

    #[test]
    fn indirect_calls_read_their_operand_first() {
        let mut cpu = cpu_with_stack();
        cpu.set_reg(Register::RAX, 0x9000);
        run(&[0xff, 0xd0], &mut cpu); // call *%rax
        assert_eq!((cpu.rip, cpu.mem[&0x7ff8]), (0x9000, 0x1002));
        let mut cpu = cpu_with_stack();
        cpu.mem.insert(0x8000, 0x7777);
        run(&[0xff, 0x14, 0x24], &mut cpu); // call *(%rsp)
        assert_eq!((cpu.rip, cpu.mem[&0x7ff8]), (0x7777, 0x1003));
        let mut cpu = cpu_with_stack();
        cpu.set_reg(Register::RBX, 0x100);
        cpu.set_reg(Register::RSI, 2);
        cpu.mem.insert(0x110, 0x5555);
        run(&[0xff, 0x54, 0xf3, 0x00], &mut cpu); // call *0x0(%rbx,%rsi,8)
        assert_eq!(cpu.rip, 0x5555);
        let mut cpu = cpu_with_stack();
        cpu.mem.insert(0x1000 + 6 + 0x20, 0x6666);
        run(&[0xff, 0x15, 0x20, 0, 0, 0], &mut cpu); // call *0x20(%rip)
        assert_eq!(cpu.rip, 0x6666);
        let mut cpu = cpu_with_stack();
        cpu.fs = 0x20000;
        cpu.mem.insert(0x20010, 0x3333);
        run(&[0x64, 0xff, 0x14, 0x25, 0x10, 0, 0, 0], &mut cpu); // call *%fs:0x10
        assert_eq!(cpu.rip, 0x3333);
    }
}
