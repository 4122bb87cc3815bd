"""JSON-extraction traffic: pull named fields out of short business texts as JSON."""

from __future__ import annotations

import random

NAMES = ["Maria Lopez", "John Carter", "Aisha Bello", "Wei Chen", "Olivia Brown",
         "Mateo Garcia", "Priya Nair", "Lukas Weber", "Yuki Tanaka", "Sofia Rossi",
         "Daniel Kim", "Amara Okafor", "Ivan Petrov", "Grace Lee"]
CITIES = ["Seattle", "Lisbon", "Nairobi", "Toronto", "Berlin", "Osaka", "Austin", "Lyon",
          "Melbourne", "Denver", "Madrid", "Oslo"]
COMPANIES = ["Acme Corp", "Blue Harbor Ltd", "Nova Systems", "Pine & Oak", "Redline Media",
             "Sunbeam Foods", "Atlas Logistics", "Orbit Labs"]
PRODUCTS = ["wireless headphones", "standing desk", "coffee grinder", "running shoes",
            "laptop stand", "electric kettle", "backpack", "desk lamp", "yoga mat"]
MONTHS = ["January", "February", "March", "April", "May", "June", "July", "August",
          "September", "October", "November", "December"]


def _order(rng: random.Random) -> tuple[str, list[str]]:
    text = rng.choice([
        "Hi, this is {name} from {city}. My order {num} for a {product} never arrived.",
        "Order #{num} ({product}, qty {qty}) was shipped to {name} in {city} on "
        "{month} {day}.",
        "{name} ({city}) wants to return the {product} from order {num}; it arrived "
        "damaged.",
    ]).format(name=rng.choice(NAMES), city=rng.choice(CITIES), num=rng.randint(10000, 99999),
              product=rng.choice(PRODUCTS), qty=rng.randint(1, 5), month=rng.choice(MONTHS),
              day=rng.randint(1, 28))
    return text, rng.sample(["name", "city", "order_number", "product", "quantity", "date"],
                            rng.randint(3, 5))


def _invoice(rng: random.Random) -> tuple[str, list[str]]:
    text = ("Invoice {inv} from {company} to {client}, dated {month} {day}, {year}. "
            "Total due: ${total}.{cents:02d}, payable within {terms} days.").format(
        inv=f"INV-{rng.randint(1000, 9999)}", company=rng.choice(COMPANIES),
        client=rng.choice(COMPANIES), month=rng.choice(MONTHS), day=rng.randint(1, 28),
        year=rng.choice([2023, 2024, 2025]), total=rng.randint(50, 20000),
        cents=rng.randint(0, 99), terms=rng.choice([14, 30, 45, 60]))
    return text, rng.sample(["invoice_number", "seller", "buyer", "date", "total",
                             "payment_terms_days"], rng.randint(3, 6))


def _event(rng: random.Random) -> tuple[str, list[str]]:
    text = rng.choice([
        "Join us for the {topic} meetup in {city} on {month} {day} at {hour} pm. "
        "Hosted by {company}. Tickets cost ${price}.",
        "{company} invites you to a {topic} workshop, {month} {day}, {city}. Starts at "
        "{hour}:00, free for members, ${price} otherwise.",
    ]).format(topic=rng.choice(["data science", "cloud security", "product design",
                                "machine learning", "startup funding"]),
              city=rng.choice(CITIES), month=rng.choice(MONTHS), day=rng.randint(1, 28),
              hour=rng.randint(1, 8), company=rng.choice(COMPANIES), price=rng.randint(5, 90))
    return text, rng.sample(["event_name", "city", "date", "time", "organizer", "price"],
                            rng.randint(3, 5))


def _job(rng: random.Random) -> tuple[str, list[str]]:
    text = ("{company} is hiring a {role} in {city}. {years}+ years of experience, "
            "salary ${low}k-${high}k, {mode}.").format(
        company=rng.choice(COMPANIES), role=rng.choice(["data analyst", "backend engineer",
                                                        "sales manager", "designer",
                                                        "nurse", "accountant"]),
        city=rng.choice(CITIES), years=rng.randint(1, 8), low=rng.randint(40, 90),
        high=rng.randint(95, 180), mode=rng.choice(["remote", "hybrid", "on site"]))
    return text, rng.sample(["company", "job_title", "location", "min_years_experience",
                             "salary_range", "work_mode"], rng.randint(3, 6))


KINDS = [_order, _invoice, _event, _job]
ASKS = [
    "Extract the following fields as JSON: {fields}.\n\nText: {text}",
    "Return a JSON object with the keys {fields} from this text:\n{text}",
    "From the text below, extract {fields}. Answer with JSON only.\n\n{text}",
    "Text: \"{text}\"\nGive me JSON with these fields: {fields}.",
]
SYSTEMS = ["You extract structured data from text and answer with valid JSON.",
           "You are a data-entry assistant. Output JSON only.",
           "You convert messages into JSON records."]


def build(rng: random.Random) -> list[dict[str, str]]:
    text, fields = rng.choice(KINDS)(rng)
    user = rng.choice(ASKS).format(fields=", ".join(fields), text=text)
    return [{"role": "system", "content": rng.choice(SYSTEMS)},
            {"role": "user", "content": user}]
