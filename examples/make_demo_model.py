#!/usr/bin/env python3
"""Writes examples/demo-model/*.json: the scripted demo model.

When no API key is configured, scripts/demo.sh points coderq at the fake
OpenAI-compatible server (tests/fakes/fake_llm.py) loaded with these
scripts. Each script is picked by a phrase of its job's prompt ("match")
and replays what a model would do, including a first attempt with a real
bug (a wrong column name, a missing import, a wrong sign) that the
reflection loop then fixes. Nothing is faked on the kernel side: every
cell really runs, and the job's tests really check the result.
"""
import json
import os

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "demo-model")


def call(code):
    return {"code": code}


SCRIPTS = {}

SCRIPTS["eda"] = {
    "match": "Load sales.csv (daily sales",
    "steps": [
        {"content": "I will load the data and look at its structure first.",
         "tool_calls": [call(
             "import pandas as pd\n"
             "df = pd.read_csv('sales.csv', parse_dates=['date'])\n"
             "print(df.shape)\n"
             "print(df.dtypes)\n"
             "print(df[['unit_sold', 'revenue']].describe())\n")]},
        {"content": "The column is called units_sold, not unit_sold. Fixing that.",
         "tool_calls": [call(
             "print(df.columns.tolist())\n"
             "print(df[['units_sold', 'revenue']].describe().round(2))\n"
             "per_region = df.groupby('region')['revenue'].sum().round(2)\n"
             "print(per_region)\n")]},
        {"tool_calls": [call(
            "import matplotlib.pyplot as plt\n"
            "fig, ax = plt.subplots(figsize=(8, 3.5))\n"
            "ax.plot(df['date'], df['units_sold'], lw=1)\n"
            "ax.set_xlabel('date'); ax.set_ylabel('units sold')\n"
            "fig.savefig('units_over_time.png', dpi=100, bbox_inches='tight')\n"
            "plt.show()\n"
            "fig, ax = plt.subplots(figsize=(5, 3.5))\n"
            "ax.hist(df['revenue'], bins=20)\n"
            "ax.set_xlabel('revenue (EUR)'); ax.set_ylabel('days')\n"
            "fig.savefig('revenue_hist.png', dpi=100, bbox_inches='tight')\n"
            "plt.show()\n"
            "print('units_sold: min %d, median %d, max %d' % (df.units_sold.min(), df.units_sold.median(), df.units_sold.max()))\n"
            "print('revenue: mean %.2f, sd %.2f' % (df.revenue.mean(), df.revenue.std()))\n")]},
        {"content": "The data has 120 rows and 6 columns (date, region, advertising_k, "
         "price, units_sold, revenue). I reported summary statistics, total revenue "
         "per region, and saved units_over_time.png and revenue_hist.png."},
    ],
}

SCRIPTS["regression"] = {
    "match": "fit an ordinary least squares regression of units_sold",
    "steps": [
        {"tool_calls": [call(
            "X = np.column_stack([np.ones(len(df)), df['advertising_k'], df['price']])\n"
            "beta, *_ = np.linalg.lstsq(X, df['units_sold'], rcond=None)\n"
            "print(beta)\n")]},
        {"content": "numpy was not imported in this session yet.",
         "tool_calls": [call(
             "import numpy as np\n"
             "X = np.column_stack([np.ones(len(df)), df['advertising_k'], df['price']])\n"
             "y = df['units_sold'].to_numpy(float)\n"
             "beta, *_ = np.linalg.lstsq(X, y, rcond=None)\n"
             "resid = y - X @ beta\n"
             "r2 = 1 - resid.var() / y.var()\n"
             "print('intercept %.2f, advertising %.3f per kEUR, price %.3f per EUR' % tuple(beta))\n"
             "print('R^2 = %.3f' % r2)\n"
             "import matplotlib.pyplot as plt\n"
             "fig, ax = plt.subplots(figsize=(5, 3.5))\n"
             "ax.scatter(X @ beta, resid, s=10)\n"
             "ax.axhline(0, color='k', lw=0.8)\n"
             "ax.set_xlabel('fitted units'); ax.set_ylabel('residual')\n"
             "fig.savefig('residuals.png', dpi=100, bbox_inches='tight')\n"
             "plt.show()\n"
             "\n"
             "def ols(xs, ys):\n"
             "    xs = np.asarray(xs, float); ys = np.asarray(ys, float)\n"
             "    slope = ((xs - xs.mean()) * (ys - ys.mean())).sum() / ((xs - xs.mean()) ** 2).sum()\n"
             "    return float(slope), float(ys.mean() - slope * xs.mean())\n"
             "print(ols([1, 2, 3, 4], [3, 5, 7, 9]))\n")]},
        {"content": "Units sold rise with advertising and fall with price; the fit, R^2 "
         "and a residual plot (residuals.png) are above. ols(xs, ys) returns "
         "(slope, intercept)."},
    ],
}

SCRIPTS["sir"] = {
    "match": "Simulate an SIR epidemic",
    "steps": [
        {"tool_calls": [call(
            "import numpy as np\n"
            "from scipy.integrate import solve_ivp\n"
            "N, beta, gamma = 10_000, 0.3, 0.1\n"
            "def sir(t, y):\n"
            "    s, i, r = y\n"
            "    return [-beta * s * i / N, beta * s * i / N - gamma * i, gamma * i]\n"
            "t = np.linspace(0, 160, 161)\n"
            "sol = solve_ivp(sir, (0, 160), [N - 1, 1, 0], t_eval=t, rtol=1e-8)\n"
            "S, I, R = sol.y\n"
            "k = int(np.argmax(I))\n"
            "print('peak infected %.0f on day %d' % (I[k], t[k]))\n"
            "import matplotlib.pyplot as plt\n"
            "fig, ax = plt.subplots(figsize=(6, 3.5))\n"
            "for v, name in ((S, 'S'), (I, 'I'), (R, 'R')):\n"
            "    ax.plot(t, v, label=name)\n"
            "ax.set_xlabel('day'); ax.set_ylabel('people'); ax.legend()\n"
            "fig.savefig('sir.png', dpi=100, bbox_inches='tight')\n"
            "plt.show()\n"
            "from scipy.optimize import brentq\n"
            "def final_size(r0):\n"
            "    return brentq(lambda z: z - 1 + np.exp(-r0 * z), 0.0, 1.0)\n"
            "print(final_size(3.0))\n")]},
        {"content": "brentq found the trivial root z = 0. The bracket must exclude it.",
         "tool_calls": [call(
             "def final_size(r0):\n"
             "    return float(brentq(lambda z: z - 1 + np.exp(-r0 * z), 1e-9, 1.0))\n"
             "print('final size R0=2: %.4f, R0=3: %.4f' % (final_size(2.0), final_size(3.0)))\n")]},
        {"content": "The epidemic peaks at about 3,000 infected people around day 70 "
         "(see sir.png). final_size(r0) solves z = 1 - exp(-r0 z) for its non-zero root."},
    ],
}

SCRIPTS["sir-sensitivity"] = {
    "match": "vary beta from 0.15 to 0.45",
    "steps": [
        {"tool_calls": [call(
            "rows = []\n"
            "for b in np.linspace(0.15, 0.45, 7):\n"
            "    beta = b\n"
            "    sol = solve_ivp(sir, (0, 160), [N - 1, 1, 0], t_eval=t, rtol=1e-8)\n"
            "    I = sol.y[1]\n"
            "    rows.append((b, I.max(), t[int(np.argmax(I))]))\n"
            "    print('beta %.2f: peak %.0f on day %d' % rows[-1])\n"
            "fig, ax = plt.subplots(figsize=(5, 3.5))\n"
            "ax.plot([r[0] for r in rows], [r[1] for r in rows], 'o-')\n"
            "ax.set_xlabel('beta'); ax.set_ylabel('peak infected')\n"
            "fig.savefig('sensitivity.png', dpi=100, bbox_inches='tight')\n"
            "plt.show()\n")]},
        {"content": "A higher beta makes the peak both larger and earlier; see "
         "sensitivity.png and the table above."},
    ],
}

SCRIPTS["lp"] = {
    "match": "A workshop makes tables and chairs",
    "steps": [
        {"tool_calls": [call(
            "from scipy.optimize import linprog\n"
            "res = linprog(c=[70, 50], A_ub=[[4, 3], [2, 1]], b_ub=[240, 100], bounds=[(0, None)] * 2)\n"
            "print(res.x, res.fun)\n"
            "def max_profit():\n"
            "    return float(res.fun)\n")]},
        {"content": "This is the final plan."},
        {"content": "linprog minimises, so I must negate the profit. Fixing.",
         "tool_calls": [call(
             "res = linprog(c=[-70, -50], A_ub=[[4, 3], [2, 1]], b_ub=[240, 100], bounds=[(0, None)] * 2)\n"
             "tables, chairs = res.x\n"
             "print('tables %.1f, chairs %.1f, profit %.2f EUR' % (tables, chairs, -res.fun))\n"
             "def max_profit():\n"
             "    return float(-res.fun)\n")]},
        {"content": "Make 30 tables and 40 chairs a week for a profit of 4,100 EUR; "
         "both carpentry and finishing hours are fully used."},
    ],
}

SCRIPTS["ttest"] = {
    "match": "Welch's t-test",
    "steps": [
        {"tool_calls": [call(
            "import pandas as pd\n"
            "from scipy import stats\n"
            "df = pd.read_csv('sales.csv')\n"
            "north = df.loc[df.region == 'north', 'units_sold']\n"
            "south = df.loc[df.region == 'south', 'units_sold']\n"
            "t, p = stats.ttest_ind(north, south, equal_var=False)\n"
            "print('mean north %.1f, mean south %.1f' % (north.mean(), south.mean()))\n"
            "print('t = %.3f, p = %.4f' % (t, p))\n"
            "print('reject H0 at 5%' if p < 0.05 else 'no significant difference at 5%')\n"
            "import matplotlib.pyplot as plt\n"
            "fig, ax = plt.subplots(figsize=(5, 3.5))\n"
            "df.boxplot(column='units_sold', by='region', ax=ax)\n"
            "plt.suptitle('')\n"
            "fig.savefig('units_by_region.png', dpi=100, bbox_inches='tight')\n"
            "plt.show()\n")]},
        {"content": "Welch's t-test compares north and south; the means, t statistic, "
         "p-value and the 5% decision are printed above, with a box plot per region."},
    ],
}

SCRIPTS["logistic"] = {
    "match": "Generate noisy observations of a logistic curve",
    "steps": [
        {"tool_calls": [call(
            "import numpy as np\n"
            "from scipy.optimize import curve_fit\n"
            "def logistic(t, K, r, t0):\n"
            "    return K / (1 + np.exp(-r * (t - t0)))\n"
            "rng = np.random.default_rng(1)\n"
            "t = np.arange(0, 31)\n"
            "y = logistic(t, 1000, 0.4, 15) + rng.normal(0, 20, t.size)\n"
            "p, cov = curve_fit(logistic, t, y, p0=[y.max(), 0.1, t.mean()])\n"
            "print('K = %.1f, r = %.3f, t0 = %.2f' % tuple(p))\n"
            "print('standard errors:', np.sqrt(np.diag(cov)).round(3))\n"
            "import matplotlib.pyplot as plt\n"
            "fig, ax = plt.subplots(figsize=(5, 3.5))\n"
            "ax.plot(t, y, 'o', ms=3, label='data')\n"
            "ax.plot(t, logistic(t, *p), label='fit')\n"
            "ax.legend(); fig.savefig('logistic_fit.png', dpi=100, bbox_inches='tight')\n"
            "plt.show()\n")]},
        {"content": "The fitted parameters are close to the true K = 1000, r = 0.4, "
         "t0 = 15 (printed above with standard errors); see logistic_fit.png."},
    ],
}

SCRIPTS["montecarlo"] = {
    "match": "Estimate pi by Monte Carlo",
    "steps": [
        {"tool_calls": [call(
            "import numpy as np\n"
            "rng = np.random.default_rng(42)\n"
            "sizes = [10 ** k for k in range(2, 7)]\n"
            "errors = []\n"
            "for n in sizes:\n"
            "    xy = rng.random((n, 2))\n"
            "    est = 4 * np.mean((xy ** 2).sum(axis=1) <= 1)\n"
            "    errors.append(abs(est - np.pi))\n"
            "    print('n = %7d: estimate %.5f, error %.5f' % (n, est, errors[-1]))\n"
            "import matplotlib.pyplot as plt\n"
            "fig, ax = plt.subplots(figsize=(5, 3.5))\n"
            "ax.loglog(sizes, errors, 'o-', label='|error|')\n"
            "ax.loglog(sizes, 1.6 / np.sqrt(sizes), '--', label='1.6/sqrt(n)')\n"
            "ax.set_xlabel('samples'); ax.legend()\n"
            "fig.savefig('mc_error.png', dpi=100, bbox_inches='tight')\n"
            "plt.show()\n")]},
        {"content": "The error shrinks roughly like 1/sqrt(n), as the log-log plot shows."},
    ],
}

SCRIPTS["markov"] = {
    "match": "transition matrix [[0.8, 0.15, 0.05]",
    "steps": [
        {"tool_calls": [call(
            "import numpy as np\n"
            "P = np.array([[0.8, 0.15, 0.05], [0.3, 0.5, 0.2], [0, 0, 1]])\n"
            "def churn_probability(months):\n"
            "    return float(np.linalg.matrix_power(P, months)[0, 2])\n"
            "Q = P[:2, :2]\n"
            "t = np.linalg.solve(np.eye(2) - Q, np.ones(2))\n"
            "print('P(churned after 12 months | active) = %.4f' % churn_probability(12))\n"
            "print('expected months to churn: active %.2f, dormant %.2f' % tuple(t))\n")]},
        {"content": "An active customer has churned within 12 months with the probability "
         "printed above; expected times to churn come from the fundamental matrix."},
    ],
}

SCRIPTS["queue"] = {
    "match": "Simulate an M/M/1 queue",
    "steps": [
        {"tool_calls": [call(
            "import numpy as np\n"
            "rng = np.random.default_rng(7)\n"
            "lam, mu, n = 0.8, 1.0, 50_000\n"
            "arrivals = np.cumsum(rng.exponential(1 / lam, n))\n"
            "service = rng.exponential(1 / mu, n)\n"
            "wait = np.zeros(n)\n"
            "free_at = 0.0\n"
            "for k in range(n):\n"
            "    start = max(arrivals[k], free_at)\n"
            "    wait[k] = start - arrivals[k]\n"
            "    free_at = start + service[k]\n"
            "rho = lam / mu\n"
            "print('simulated mean wait %.3f min, theory %.3f min' % (wait.mean(), rho / (mu - lam)))\n"
            "import matplotlib.pyplot as plt\n"
            "fig, ax = plt.subplots(figsize=(5, 3.5))\n"
            "ax.hist(wait, bins=60)\n"
            "ax.set_xlabel('wait (min)'); ax.set_ylabel('customers')\n"
            "fig.savefig('waits.png', dpi=100, bbox_inches='tight')\n"
            "plt.show()\n")]},
        {"content": "The simulated mean wait is close to the theoretical rho/(mu - lambda) "
         "= 4 minutes; the wait distribution has a point mass at zero and an exponential tail."},
    ],
}

SCRIPTS["forecast"] = {
    "match": "forecast the next three months",
    "steps": [
        {"tool_calls": [call(
            "import pandas as pd\n"
            "df = pd.read_csv('sales.csv', parse_dates=['date'])\n"
            "monthly = df.set_index('date')['revenue'].resample('M').sum()\n"
            "ma = monthly.rolling(3).mean()\n"
            "level = monthly.iloc[0]\n"
            "for v in monthly.iloc[1:]:\n"
            "    level = 0.5 * v + 0.5 * level\n"
            "future = pd.date_range(monthly.index[-1] + pd.offsets.MonthEnd(1), periods=3, freq='M')\n"
            "forecast = pd.Series([level] * 3, index=future)\n"
            "print(monthly.round(0).to_string())\n"
            "print('forecast per month: %.0f EUR' % level)\n"
            "import matplotlib.pyplot as plt\n"
            "fig, ax = plt.subplots(figsize=(7, 3.5))\n"
            "ax.plot(monthly, label='revenue'); ax.plot(ma, label='3-month MA')\n"
            "ax.plot(forecast, 'o--', label='forecast')\n"
            "ax.legend(); fig.savefig('forecast.png', dpi=100, bbox_inches='tight')\n"
            "plt.show()\n")]},
        {"content": "Monthly revenue, its 3-month moving average and a flat exponential "
         "smoothing forecast for the next three months are shown in forecast.png."},
    ],
}

SCRIPTS["newton"] = {
    "match": "Implement newton(f, df, x0",
    "steps": [
        {"tool_calls": [call(
            "def newton(f, df, x0, tol=1e-12, max_iter=100):\n"
            "    x = x0\n"
            "    for _ in range(max_iter):\n"
            "        step = f(x) / df(x)\n"
            "        x = x + step\n"
            "        if abs(step) < tol:\n"
            "            return x\n"
            "    raise RuntimeError('newton did not converge')\n"
            "print(newton(lambda x: x**3 - 2*x - 5, lambda x: 3*x**2 - 2, 2.0))\n")]},
        {"content": "The update has the wrong sign: x must move by -f/f'.",
         "tool_calls": [call(
             "history = []\n"
             "def newton(f, df, x0, tol=1e-12, max_iter=100):\n"
             "    x = x0\n"
             "    history.clear()\n"
             "    for _ in range(max_iter):\n"
             "        step = f(x) / df(x)\n"
             "        x = x - step\n"
             "        history.append(abs(step))\n"
             "        if abs(step) < tol:\n"
             "            return x\n"
             "    raise RuntimeError('newton did not converge')\n"
             "root = newton(lambda x: x**3 - 2*x - 5, lambda x: 3*x**2 - 2, 2.0)\n"
             "print('root %.15f after %d iterations' % (root, len(history)))\n"
             "import matplotlib.pyplot as plt\n"
             "fig, ax = plt.subplots(figsize=(5, 3.5))\n"
             "ax.semilogy(range(1, len(history) + 1), history, 'o-')\n"
             "ax.set_xlabel('iteration'); ax.set_ylabel('|step|')\n"
             "fig.savefig('newton.png', dpi=100, bbox_inches='tight')\n"
             "plt.show()\n")]},
        {"content": "newton() converges quadratically to x = 2.0945514815423265 in a few "
         "iterations (see newton.png)."},
    ],
}

os.makedirs(OUT, exist_ok=True)
for name, script in SCRIPTS.items():
    with open(os.path.join(OUT, name + ".json"), "w") as f:
        json.dump(script, f, indent=1, ensure_ascii=False)
        f.write("\n")
