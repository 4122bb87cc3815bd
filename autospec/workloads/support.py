"""Customer-support traffic: an agent of one company answers, summarizes or triages tickets."""

from __future__ import annotations

import random

COMPANIES = [
    ("Northwind Bank", "bank", ["debit card", "savings account", "mobile banking app",
                                "wire transfer", "overdraft fee", "credit card statement"]),
    ("SkyHop Airlines", "airline", ["flight booking", "checked bag", "seat upgrade",
                                    "cancelled flight", "frequent flyer miles", "refund"]),
    ("Velo Telecom", "mobile carrier", ["data plan", "SIM card", "roaming charges",
                                        "phone bill", "5G coverage", "number transfer"]),
    ("ShopMart", "online store", ["order", "delivery", "return label", "gift card",
                                  "damaged item", "promo code"]),
    ("CloudNote", "note-taking app", ["subscription", "sync between devices",
                                      "shared notebook", "login", "export to PDF",
                                      "storage limit"]),
    ("GreenGrid Energy", "electricity provider", ["meter reading", "monthly bill",
                                                  "solar panel credit", "power outage",
                                                  "payment plan", "moving house"]),
    ("FitLoop", "fitness tracker", ["heart-rate sensor", "battery", "app pairing",
                                    "step count", "warranty", "strap"]),
    ("StayWell Hotels", "hotel chain", ["reservation", "late checkout", "loyalty points",
                                        "room service charge", "cancellation", "parking"]),
]
PROBLEMS = [
    "was charged twice for the {thing}",
    "has not received a confirmation for the {thing}",
    "cannot get the {thing} to work since yesterday",
    "wants to cancel the {thing}",
    "was promised a refund for the {thing} two weeks ago and has heard nothing",
    "says the {thing} stopped working after the last update",
    "is asking how to change the {thing}",
    "reports that the {thing} shows the wrong amount",
    "is unhappy with how long the {thing} is taking",
    "wants to know whether the {thing} can be transferred to a family member",
    "was told by another agent that the {thing} would be fixed, but it was not",
    "is asking for compensation because of a problem with the {thing}",
]
NAMES = ["Maria", "James", "Aisha", "Chen", "Olivia", "Mateo", "Priya", "Lukas", "Fatima",
         "Noah", "Yuki", "Sofia", "Daniel", "Amara", "Ivan", "Grace", "Omar", "Hannah",
         "Diego", "Leila", "Tom", "Anika", "Kwame", "Elena"]
FEELINGS = ["frustrated", "polite but worried", "angry", "confused", "in a hurry",
            "calm", "disappointed", "anxious"]
DETAILS = [
    "They have been a customer for {years} years.",
    "This is the {nth} time they contact support about it.",
    "The reference number is {ref}.",
    "They mention they are travelling next week.",
    "They already tried restarting and reinstalling.",
    "They are asking to speak to a manager.",
    "The amount involved is ${amount}.",
    "They would prefer an answer by phone.",
    "",
    "",
]
TASKS = [
    "Write a reply to the customer.",
    "Write a short, empathetic reply to the customer that explains the next steps.",
    "Draft an apology and offer a solution.",
    "Summarize the ticket in two sentences for the next agent.",
    "Classify the ticket as billing, technical, account or other, and explain why.",
    "List the questions you need to ask the customer before you can help.",
    "Write step-by-step instructions the customer can follow.",
    "Write an internal note for the escalation team.",
]
TONES = ["", "", " Keep it friendly.", " Be concise.", " Use a formal tone.",
         " Do not promise anything you cannot deliver.", " Keep it under 80 words."]
OPENERS = [
    "Ticket: {name} {problem}. {detail}",
    "Customer {name} ({feeling}) {problem}. {detail}",
    "A customer named {name} writes in and {problem}. {detail}",
    "New message from {name}, who {problem}. The customer seems {feeling}. {detail}",
]


def build(rng: random.Random) -> list[dict[str, str]]:
    company, business, things = rng.choice(COMPANIES)
    article = "an" if business[0] in "aeiou" else "a"
    system = (f"You are a customer support agent for {company}, {article} {business}. "
              "Answer helpfully and accurately.")
    detail = rng.choice(DETAILS).format(
        years=rng.randint(1, 15), nth=rng.choice(["second", "third", "fourth"]),
        ref=f"{rng.choice('ABCDEFGH')}{rng.randint(10000, 99999)}",
        amount=rng.choice([12, 25, 49, 80, 120, 300, 950]))
    problem = rng.choice(PROBLEMS).format(thing=rng.choice(things))
    opener = rng.choice(OPENERS).format(name=rng.choice(NAMES), problem=problem,
                                        feeling=rng.choice(FEELINGS), detail=detail)
    user = f"{opener.strip()}\n\n{rng.choice(TASKS)}{rng.choice(TONES)}"
    return [{"role": "system", "content": system}, {"role": "user", "content": user}]
