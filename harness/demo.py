"""Prints the worked GAE example of 002_a7854c31eec645ea.txt, computed by harness.estimators.gae."""
import torch

from harness.estimators import gae


def main() -> None:
    col = lambda *xs: torch.tensor(xs).reshape(-1, 1)  # noqa: E731
    rewards, values = col(0.0, 0.0, 1.0), col(0.5, 0.4, 0.8)
    next_values, terminated, truncated = col(0.4, 0.8, 0.0), col(0, 0, 1), col(0, 0, 0)
    print("3 tokens, final reward 1, V = (0.5, 0.4, 0.8), gamma = 1")
    for lam in (1.0, 0.0):
        adv, ret = gae(rewards, values, next_values, terminated, truncated, gamma=1.0, lam=lam)
        fmt = lambda x: "[" + ", ".join(f"{v:+.1f}" for v in x.flatten().tolist()) + "]"  # noqa: E731
        print(f"lambda={lam:.0f}: advantages {fmt(adv)}  returns {fmt(ret)}")


if __name__ == "__main__":
    main()
