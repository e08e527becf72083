#!/usr/bin/python3
"""A3C in PyTorch on the servers: each copy of this script is an actor-learner
with its own CartPole-v1, pushing the n-step actor-critic gradient of every
--t-max steps; the servers hold the weights and the optimizer (async: A3C,
sync: A2C). The same defaults as `downpour-worker --env cartpole-v1`
(docs/LAB.md, "Reinforcement learning"), with the loop in your hands:

    PYTHONPATH=build/python build/downpour launch --workers 2 --mode async \\
        --model "fc:64 tanh fc:64 tanh ac:2" --input 4x1x1 -- python3 examples/torch_a3c.py

With --obs-norm the module starts with the spec's obsnorm (give the servers
"obsnorm fc:64 tanh fc:64 tanh ac:2"): observations normalised by running
statistics that each segment's training merges its own into and the push
carries, so the servers keep one set for every worker, as downpour-worker's
--obs-norm on does.

The module's tensors are named as the spec's (fc1, fc2, policy, value), so
the servers' model and this module are one; the lines marked "Downpour" are
all it takes. CartPole-v1 is written out below in NumPy from its public
equations (Gymnasium's definition, as worker/exec/env/cartpole.c). Each worker
takes its share of --env-steps (the C worker's budget is the servers'
count of every worker's steps; this loop keeps its own). Task 0 waits for
the others, plays 100 greedy episodes on the final weights and stops the
servers.
"""
import argparse
import math
import os
import time

import numpy as np
import torch
from torch import nn

import downpour.torch  # Downpour

SPEC = "fc:64 tanh fc:64 tanh ac:2"


class CartPole:
    """CartPole-v1: push the cart left (0) or right (1); +1 a step while the
    pole is within 12 degrees and the cart within 2.4; 500 steps at most."""

    def __init__(self, rng):
        self.rng = rng
        self.reset()

    def reset(self):
        self.s = self.rng.uniform(-0.05, 0.05, 4)
        self.steps, self.ret = 0, 0.0
        return self.s.astype(np.float32)

    def step(self, a):
        x, xd, th, thd = self.s
        force = 10.0 if a == 1 else -10.0
        c, s = math.cos(th), math.sin(th)
        temp = (force + 0.05 * thd * thd * s) / 1.1
        tha = (9.8 * s - c * temp) / (0.5 * (4.0 / 3.0 - 0.1 * c * c / 1.1))
        xa = temp - 0.05 * tha * c / 1.1
        x, xd = x + 0.02 * xd, xd + 0.02 * xa  # Euler, as Gymnasium's default
        th, thd = th + 0.02 * thd, thd + 0.02 * tha
        self.s = np.array([x, xd, th, thd])
        self.steps += 1
        self.ret += 1.0
        terminated = abs(x) > 2.4 or abs(th) > 12 * 2 * math.pi / 360
        truncated = not terminated and self.steps >= 500
        return self.s.astype(np.float32), 1.0, terminated, truncated


class ObsNorm(nn.Module):
    """The spec's obsnorm (kernels/obs_norm.c): each component by the running
    mean and variance of the observations trained on, clipped to +-10; the
    statistics are buffers, so the servers keep them (a push carries them)."""

    def __init__(self, n):
        super().__init__()
        self.register_buffer("running_mean", torch.zeros(n))
        self.register_buffer("running_var", torch.ones(n))
        self.register_buffer("count", torch.zeros((), dtype=torch.long))

    def forward(self, x):
        return ((x - self.running_mean) / torch.sqrt(self.running_var + 1e-8)).clamp(-10, 10)

    @torch.no_grad()
    def merge(self, x):
        """Chan et al.'s pairwise rule, the count stopping at 2^20."""
        n, b = float(self.count), x.shape[0]
        total = n + b
        xd = x.double()
        bm, bv = xd.mean(0), xd.var(0, unbiased=False)
        delta = bm - self.running_mean.double()
        m2 = self.running_var.double() * n + bv * b + delta * delta * n * b / total
        self.running_mean += (delta * b / total).float()
        self.running_var.copy_((m2 / total).float())
        self.count.fill_(int(min(total, 1 << 20)))


class ActorCritic(nn.Module):
    """The spec's network: a tanh trunk, a softmax policy and a value."""

    def __init__(self, obs_norm=False):
        super().__init__()
        if obs_norm:
            self.obsnorm = ObsNorm(4)
        self.fc1, self.fc2 = nn.Linear(4, 64), nn.Linear(64, 64)
        self.policy, self.value = nn.Linear(64, 2), nn.Linear(64, 1)

    def forward(self, x):
        if hasattr(self, "obsnorm"):
            x = self.obsnorm(x)
        h = torch.tanh(self.fc2(torch.tanh(self.fc1(x))))
        return self.policy(h), self.value(h).squeeze(-1)


def main():
    ap = argparse.ArgumentParser(description="A3C on CartPole-v1 with PyTorch, as a Downpour worker")
    ap.add_argument("--ps", help="the shards, comma-separated (default: TF_CONFIG's)")
    ap.add_argument("--task", type=int, help="this worker's index (default: TF_CONFIG's)")
    ap.add_argument("--workers", type=int, default=int(os.environ.get("WORLD_SIZE", 1)))
    ap.add_argument("--env-steps", type=int, default=500000, help="the run's, all workers together")
    ap.add_argument("--envs", type=int, default=1)
    ap.add_argument("--t-max", type=int, default=5)
    ap.add_argument("--entropy", type=float, default=0.01)
    ap.add_argument("--gamma", type=float, default=0.99)
    ap.add_argument("--reward-scale", type=float, default=0.1, help="rewards times this in the returns")
    ap.add_argument("--clip-norm", type=float, default=40.0)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--obs-norm", action="store_true", help="obsnorm first (the servers' spec too)")
    a = ap.parse_args()
    torch.manual_seed(a.seed)
    net = ActorCritic(a.obs_norm)
    ps = a.ps.split(",") if a.ps else None
    spec = ("obsnorm " if a.obs_norm else "") + SPEC
    with downpour.torch.Worker(net, ps=ps, task_index=a.task, spec=spec, input=(4, 1, 1)) as w:  # Downpour
        task = w.info.task_index
        rng = np.random.default_rng([a.seed, task])
        envs = [CartPole(rng) for _ in range(a.envs)]
        obs = [e.s.astype(np.float32) for e in envs]
        returns, taken = [], 0
        budget = a.env_steps // a.workers + (task < a.env_steps % a.workers)
        t0 = time.monotonic()
        while taken < budget:
            w.pull()                                           # Downpour: the current weights
            xs, acts, rews, ends, cuts = [], [], [], [], []
            for _ in range(a.t_max):                           # a segment: K envs, T steps
                x = torch.from_numpy(np.stack(obs))
                with torch.no_grad():
                    logits, _ = net(x)
                act = torch.distributions.Categorical(logits=logits).sample()
                row_r, row_end, row_cut = [], [], []
                for k, e in enumerate(envs):
                    o, r, term, trunc = e.step(int(act[k]))
                    row_r.append(r * a.reward_scale)
                    row_end.append(2 if trunc else 1 if term else 0)
                    cut = 0.0
                    if trunc:  # cut by the time limit: its future is the critic's guess
                        with torch.no_grad():
                            cut = float(net(torch.from_numpy(o)[None])[1])
                    row_cut.append(cut)
                    if term or trunc:
                        returns.append(e.ret)
                        o = e.reset()
                    obs[k] = o
                xs.append(x), acts.append(act), rews.append(row_r), ends.append(row_end), cuts.append(row_cut)
            taken += a.envs * a.t_max
            with torch.no_grad():
                nxt = net(torch.from_numpy(np.stack(obs)))[1].numpy().astype(np.float64)
            ret = np.zeros((a.t_max, a.envs))
            for t in reversed(range(a.t_max)):             # n-step returns, backwards
                for k in range(a.envs):
                    nxt[k] = 0.0 if ends[t][k] == 1 else cuts[t][k] if ends[t][k] == 2 else nxt[k]
                    nxt[k] = rews[t][k] + a.gamma * nxt[k]
                    ret[t, k] = nxt[k]
            logits, value = net(torch.cat(xs))
            if a.obs_norm:
                net.obsnorm.merge(torch.cat(xs))  # after the forward, as the C worker: the push carries them
            ret = torch.from_numpy(ret.reshape(-1)).float()
            logp = torch.log_softmax(logits, -1)
            adv = ret - value
            pol = -(adv.detach() * logp.gather(1, torch.cat(acts)[:, None]).squeeze(1)).mean()
            ent = -(logp.exp() * logp).sum(1).mean()
            loss = pol + 0.5 * adv.pow(2).mean() - a.entropy * ent
            net.zero_grad()
            loss.backward()
            if a.clip_norm > 0:
                nn.utils.clip_grad_norm_(net.parameters(), a.clip_norm)
            w.push(loss=loss, batch=a.envs * a.t_max)         # Downpour: instead of opt.step()
        last = returns[-100:]
        rate = taken / (time.monotonic() - t0)
        print(f"worker {task}: {taken} env steps, {len(returns)} episodes, mean of the last "
              f"{len(last)} {np.mean(last) if last else 0:.1f}, {rate:.0f} env steps/s", flush=True)
        if task == 0:
            w.wait_all()                                       # Downpour: every worker is done
            w.pull()
            test = []
            for _ in range(100):                               # the greedy policy, fresh episodes
                e = CartPole(np.random.default_rng([a.seed, 1 << 20, len(test)]))
                o, done = e.s.astype(np.float32), False
                while not done:
                    with torch.no_grad():
                        o, _, term, trunc = e.step(int(net(torch.from_numpy(o)[None])[0].argmax()))
                    done = term or trunc
                test.append(e.ret)
            st = w.stats()
            print(f"test return {np.mean(test):.1f}; the servers applied {st['applied']} pushes, "
                  f"staleness mean {st['staleness_mean']:.2f}", flush=True)
            w.shutdown()                                       # Downpour: stop the servers


if __name__ == "__main__":
    main()
