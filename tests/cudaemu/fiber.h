// fiber.h (emulated device): one stack per CUDA thread and a switch between stacks.
// x86-64 uses a hand-written switch (callee-saved registers, MXCSR and the x87 control
// word: no system call, unlike swapcontext's signal mask); other targets use ucontext.
// Under AddressSanitizer every switch is announced to it, so it follows the stacks.
#ifndef VARENT_EMU_FIBER_H
#define VARENT_EMU_FIBER_H

#include <stddef.h>

#if !defined(__x86_64__)
#include <ucontext.h>
#endif

namespace emu {

struct fiber {
#if defined(__x86_64__)
    void *sp = nullptr;  // saved stack pointer while switched out
#else
    ucontext_t uc;
#endif
    char *stack = nullptr;  // [stack_size] bytes, nullptr for the scheduler's own fiber
    size_t stack_size = 0;
    void *asan_fake = nullptr;        // AddressSanitizer's fake stack while switched out
    const void *asan_bottom = nullptr;  // the scheduler's own stack, as ASan reported it
    size_t asan_size = 0;
};

// Prepares f to run entry(arg) on its stack at the next switch to it. entry must not
// return: it switches away for the last time instead.
void fiber_init(fiber *f, void (*entry)(void *), void *arg);
// Saves the running context in from and resumes to.
void fiber_switch(fiber *from, fiber *to);
// The first thing a fiber's entry does (from: the fiber that switched to it).
void fiber_entered(fiber *from);
// The last switch of a fiber whose entry is done (it is never resumed).
void fiber_exit(fiber *self, fiber *to);

}  // namespace emu

#endif
