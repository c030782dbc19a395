"""Print a results JSON written by bench/device_check.py as a Markdown table.

    python bench/table.py bench/results/nvidia-h200-table.json
"""

import json
import sys


def main(path: str) -> None:
    r = json.load(open(path))
    print(f"{r['device']}, {r['date']}: copy {r['copy_GBps']:.0f} GB/s (read+write); bf16 input; "
          f"bit-exact checks {r['checks'] - r['failures']}/{r['checks']}\n")
    shapes = []
    for row in r["rows"]:
        if (row["M"], row["N"]) not in shapes:
            shapes.append((row["M"], row["N"]))
    names = []
    for row in r["rows"]:
        if row["name"] not in names:
            names.append(row["name"])
    print("| op | " + " | ".join(f"{m}x{n}" for m, n in shapes) + " |")
    print("|---|" + "---|" * len(shapes))
    for name in names:
        cells = []
        for m, n in shapes:
            row = next((x for x in r["rows"] if x["name"] == name and (x["M"], x["N"]) == (m, n)), None)
            if row is None:
                cells.append("-")
                continue
            cell = f"{row['pct_copy']:.1f}% ({row['ms'] * 1000:.1f} us)"
            if "mxq_speedup" in row:
                cell += f", mxq {row['mxq_speedup']:.2f}x"
            cells.append(cell)
        print(f"| {name} | " + " | ".join(cells) + " |")
    if any("pct_equal_copy" in row for row in r["rows"]):
        print("\nThe same rows against a copy of exactly the bytes each moves (at that size):\n")
        print("| op | " + " | ".join(f"{m}x{n}" for m, n in shapes) + " |")
        print("|---|" + "---|" * len(shapes))
        for name in names:
            cells = [next((f"{x['pct_equal_copy']:.1f}%" for x in r["rows"] if x["name"] == name
                           and (x["M"], x["N"]) == (m, n) and "pct_equal_copy" in x), "-") for m, n in shapes]
            print(f"| {name} | " + " | ".join(cells) + " |")
    if "note" in r:
        print(f"\nnote: {r['note']}")
    for k in ("host_us_256x4096_both", "host_us_256x4096_both_fastest_cpu", "gpu_us_1024x1024_rowwise"):
        if k in r:
            print(f"\n{k}: {r[k]}")


if __name__ == "__main__":
    main(sys.argv[1])
