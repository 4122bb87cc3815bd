"""Coding traffic: write, explain, fix or test small functions in a few languages."""

from __future__ import annotations

import random

LANGUAGES = ["Python", "Python", "Python", "JavaScript", "TypeScript", "Go", "Rust", "Java"]
FUNCTIONS = [
    "returns the sum of the squares of a list of integers",
    "checks whether a string is a palindrome, ignoring case and spaces",
    "counts how many times each word appears in a text",
    "returns the n-th Fibonacci number",
    "merges two sorted lists into one sorted list",
    "removes duplicates from a list while keeping the order",
    "converts a temperature from Celsius to Fahrenheit",
    "finds the largest number in a list",
    "reverses the words in a sentence",
    "checks whether a number is prime",
    "flattens a nested list",
    "returns the average of a list of numbers, or zero for an empty list",
    "splits a list into chunks of a given size",
    "validates that a string looks like a date in YYYY-MM-DD format",
    "computes the factorial of a number",
    "returns the most common character in a string",
    "groups a list of words by their first letter",
    "parses a line of comma-separated values into a list of fields",
]
SNIPPETS = [
    ("Python", "def f(xs):\n    out = []\n    for x in xs:\n        if x % 2 == 0:\n"
               "            out.append(x * x)\n    return out"),
    ("Python", "def g(s):\n    return s == s[::-1]"),
    ("Python", "total = 0\nfor i in range(len(items)):\n    total += items[i]\n"
               "print(total / len(items))"),
    ("JavaScript", "function add(a, b) {\n  return a + b;\n}\nconsole.log(add('1', 2));"),
    ("JavaScript", "const nums = [3, 1, 2];\nnums.sort();\nconsole.log(nums[0]);"),
    ("Python", "def last(xs):\n    return xs[len(xs)]"),
    ("Go", "func sum(xs []int) int {\n\ttotal := 0\n\tfor _, x := range xs {\n"
           "\t\ttotal += x\n\t}\n\treturn total\n}"),
    ("Python", "with open('data.txt') as f:\n    lines = f.readlines()\n"
               "print(len(lines))"),
]
WRITE = [
    "Write a {lang} function that {what}.",
    "In {lang}, implement a function that {what}.",
    "Can you write {lang} code for a function that {what}?",
    "I need a {lang} function that {what}. Please include a short example.",
]
EXTRAS = ["", "", " Add a docstring.", " Add comments.", " Keep it short.",
          " Handle empty input.", " Include type hints.", " Explain the time complexity."]
OTHER = [
    "Explain what this {lang} code does:\n\n{code}",
    "Find the bug in this {lang} code and fix it:\n\n{code}",
    "Write unit tests for this {lang} code:\n\n{code}",
    "Rewrite this {lang} code to be more readable:\n\n{code}",
]
SYSTEMS = [
    "You are a helpful programming assistant.",
    "You are a senior software engineer who writes clear, correct code.",
    "You are a coding tutor. Explain your answers simply.",
]


def build(rng: random.Random) -> list[dict[str, str]]:
    if rng.random() < 0.7:
        user = rng.choice(WRITE).format(lang=rng.choice(LANGUAGES),
                                        what=rng.choice(FUNCTIONS)) + rng.choice(EXTRAS)
    else:
        lang, code = rng.choice(SNIPPETS)
        user = rng.choice(OTHER).format(lang=lang, code=code)
    return [{"role": "system", "content": rng.choice(SYSTEMS)},
            {"role": "user", "content": user}]
