//! The per-probe stub a jump probe jumps to (pure: the bytes, built for an address).
//!
//! A stub steps over the red zone, leaves an opaque context word (the probe point) on the
//! stack and calls the common save/restore code, whose address it holds after its code: the
//! common code saves the registers into a `struct pt_regs`, runs the handlers and returns to
//! the stub's body, the relocated displaced instructions, which jump back to the function.
//! The x86 layer knows neither the probe table nor the handlers: the caller passes the
//! context word and the common code's address as plain values.

use iced_x86::{
    BlockEncoder, BlockEncoderOptions, Code, FlowControl, Instruction, InstructionBlock, MemoryOperand, Register,
};

use crate::insn::jump::{JumpPlan, NoJump};

/// Bytes reserved for one stub.
pub const STUB_SIZE: usize = 160;

/// Where the relocated instructions start in a stub (after `stub_head`).
pub const BODY_OFFSET: usize = 31;

/// The fixed head of every stub: step over the red zone, leave the context word on the stack,
/// and call the common save/restore code through a pointer stored after the stub.
fn stub_head(pp: u64) -> Vec<u8> {
    let mut head = vec![0x48, 0x8d, 0xa4, 0x24, 0x78, 0xff, 0xff, 0xff]; // lea -0x88(%rsp),%rsp
    head.push(0x50); // push %rax
    head.extend([0x48, 0xb8]); // movabs $pp,%rax
    head.extend(pp.to_le_bytes());
    head.extend([0x48, 0x89, 0x44, 0x24, 0x08]); // mov %rax,0x8(%rsp)
    head.push(0x58); // pop %rax
    head.extend([0xff, 0x15, 0, 0, 0, 0]); // call *disp32(%rip), patched below
    head
}

/// The stub at `stub` with context word `pp`: head, relocated covered instructions, the jump
/// back to the end of the patched bytes, and the address of `common`.
pub fn build_stub(plan: &JumpPlan, stub: u64, pp: u64, common: u64) -> Result<Vec<u8>, NoJump> {
    let mut code = stub_head(pp);
    let body_ip = stub + code.len() as u64;
    let err = |e: iced_x86::IcedError| NoJump::Stub(e.to_string());
    let resume = plan.covered[0].ip() + plan.patch_len as u64;
    let mut body = Vec::new();
    for insn in &plan.covered {
        if insn.is_call_near() {
            // The call's return address is the original one, so the callee returns into the
            // program and unwinders see the real caller.
            let ret = insn.next_ip();
            body.push(
                Instruction::with2(Code::Lea_r64_m, Register::RSP, MemoryOperand::with_base_displ(Register::RSP, -8))
                    .map_err(err)?,
            );
            body.push(
                Instruction::with2(Code::Mov_rm32_imm32, MemoryOperand::with_base(Register::RSP), ret as u32)
                    .map_err(err)?,
            );
            body.push(
                Instruction::with2(
                    Code::Mov_rm32_imm32,
                    MemoryOperand::with_base_displ(Register::RSP, 4),
                    (ret >> 32) as u32,
                )
                .map_err(err)?,
            );
            body.push(Instruction::with_branch(Code::Jmp_rel32_64, insn.near_branch_target()).map_err(err)?);
        } else {
            body.push(*insn);
        }
    }
    let last = plan.covered.last().expect("a plan covers at least one instruction");
    if !(last.is_call_near() || matches!(last.flow_control(), FlowControl::Return | FlowControl::UnconditionalBranch)) {
        body.push(Instruction::with_branch(Code::Jmp_rel32_64, resume).map_err(err)?);
    }
    let encoded = BlockEncoder::encode(64, InstructionBlock::new(&body, body_ip), BlockEncoderOptions::NONE)
        .map_err(|e| NoJump::Unrelocatable { at: plan.covered[0].ip(), why: e.to_string() })?;
    code.extend(encoded.code_buffer);
    while !code.len().is_multiple_of(8) {
        code.push(0xcc);
    }
    let data = stub + code.len() as u64;
    let call_end = stub + stub_head(pp).len() as u64;
    let disp = (data as i64 - call_end as i64) as i32;
    let at = stub_head(pp).len() - 4;
    code[at..at + 4].copy_from_slice(&disp.to_le_bytes());
    code.extend(common.to_le_bytes());
    if code.len() > STUB_SIZE {
        return Err(NoJump::Stub(format!("{} bytes, more than a stub holds", code.len())));
    }
    Ok(code)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::insn::decode::decode_at;
    use crate::insn::jump::{patch_bytes, plan};
    use iced_x86::{Decoder, DecoderOptions, Mnemonic};

    const AT: u64 = 0x40_1000;

    #[test]
    fn body_offset_matches_the_head() {
        assert_eq!(stub_head(0).len(), BODY_OFFSET);
    }

    #[test]
    fn stub_relocates_and_jumps_back() {
        // mov 0x100(%rip),%eax (6 bytes) at AT; the stub runs it with the same target
        let f = [0x8b, 0x05, 0x00, 0x01, 0, 0, 0xc3];
        let p = plan(&f, AT, &[]).unwrap();
        let stub = AT + 0x10_0000;
        let code = build_stub(&p, stub, 0x1234, 0x7f00_0000_0000).unwrap();
        let head = stub_head(0x1234).len();
        let moved = decode_at(&code[head..], stub + head as u64).unwrap();
        assert_eq!(moved.ip_rel_memory_address(), AT + 6 + 0x100);
        let back = decode_at(&code[head + moved.len()..], moved.next_ip()).unwrap();
        assert_eq!(back.near_branch_target(), AT + 6);
        let call = decode_at(&code[head - 6..], stub + head as u64 - 6).unwrap();
        assert_eq!(call.mnemonic(), Mnemonic::Call);
        let slot = call.ip_rel_memory_address() - stub;
        assert_eq!(&code[slot as usize..slot as usize + 8], &0x7f00_0000_0000u64.to_le_bytes());
    }

    #[test]
    fn stub_replaces_a_final_call_keeping_the_real_return_address() {
        let f = [0x53, 0xe8, 0x10, 0, 0, 0, 0xc3];
        let p = plan(&f, AT, &[]).unwrap();
        let stub = AT + 0x1000;
        let code = build_stub(&p, stub, 1, 2).unwrap();
        let head = stub_head(1).len();
        let mut decoder = Decoder::with_ip(64, &code[head..], stub + head as u64, DecoderOptions::NONE);
        let mnemonics: Vec<Mnemonic> = (0..5).map(|_| decoder.decode().mnemonic()).collect();
        assert_eq!(mnemonics, [Mnemonic::Push, Mnemonic::Lea, Mnemonic::Mov, Mnemonic::Mov, Mnemonic::Jmp]);
        let mut patch = vec![0; p.patch_len];
        patch_bytes(AT, stub, &mut patch);
        assert_eq!(patch.len(), 6);
        assert_eq!(decode_at(&patch, AT).unwrap().near_branch_target(), stub);
        assert_eq!(patch[5], 0xcc);
    }
}
